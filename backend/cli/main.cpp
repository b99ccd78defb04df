// switchboard: the command-line front end.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>

#include "cli.h"
#include "switchboard/switchboard.h"

int main(int argc, char** argv) {
  CLI::App app{"Switchboard: Mixture-of-Experts programs on CPU, Vulkan and Metal with identical bits"};
  app.set_version_flag("--version", switchboard::version());
  app.require_subcommand(1);

  switchboard::cli::DemoOptions demo;
  auto* demo_cmd = app.add_subcommand(
      "demo", "Build a 4-bit MoE-layer program, save program + weights, load them back and run it (M = 1 and 8)");
  demo_cmd->add_option("--save", demo.save_dir, "Directory for program.sbp and weights.safetensors");
  demo_cmd->add_option("--device", demo.device, "cpu | vulkan | vulkan:N (no Vulkan: the CPU, with a message)");

  switchboard::cli::InspectOptions insp;
  auto* inspect_cmd = app.add_subcommand("inspect", "List a program file: header, chains, slots, constants, op counts");
  inspect_cmd->add_option("FILE", insp.path, "Program file (.sbp), or with --verify an exported model directory")
      ->required();
  inspect_cmd->add_flag("--verify", insp.verify,
                        "Also check the weights file against the program's record: size, header and a hash of "
                        "every byte (XXH3-64)");
  inspect_cmd->add_option("--weights", insp.weights, "Weights file for --verify (default: weights.safetensors beside FILE)");

  switchboard::cli::BenchOptions bench;
  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks that print JSON");
  bench_cmd->require_subcommand(1);
  auto* moe_cmd = bench_cmd->add_subcommand("moe-layer", "One MoE layer with cold weights: time, bytes, roofline");
  moe_cmd->add_option("--model", bench.model, "qwen3-30b-a3b | olmoe | granite-1b-a400m")
      ->check(CLI::IsMember({"qwen3-30b-a3b", "olmoe", "granite-1b-a400m"}));
  moe_cmd->add_option("--bits", bench.bits, "Bits of every expert (2, 3, 4, 5, 6, 8)")->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  moe_cmd->add_option("--group-size", bench.group_size, "Quantization group size")->check(CLI::IsMember({32, 64, 128}));
  moe_cmd->add_option("--tokens", bench.tokens, "Tokens M per layer call")->check(CLI::Range(1, 4096));
  moe_cmd->add_option("--mixed", bench.mixed, "Per-expert bits as bits:fraction,... e.g. 8:0.05,4:0.80,2:0.15");
  moe_cmd->add_option("--sorted", bench.sorted, "auto | always | never")->check(CLI::IsMember({"auto", "always", "never"}));
  moe_cmd->add_option("--device", bench.device, "cpu | vulkan | vulkan:N (no Vulkan: the CPU, with a message)");
  moe_cmd->add_option("--threads", bench.threads, "Kernel threads (default: all cores)");
  moe_cmd->add_option("--iterations", bench.iterations, "Timed iterations (default: automatic)");
  moe_cmd->add_flag("--json", bench.json, "One JSON object on one line");

  switchboard::cli::BenchModelOptions bm;
  auto* bm_cmd = bench_cmd->add_subcommand(
      "model", "Whole-model prefill and decode: tok/s, peak RSS, decode roofline against measured DRAM bandwidth");
  auto* bm_src = bm_cmd->add_option_group("model", "what to run");
  bm_src->add_option("--program", bm.program,
                     "Exported model directory (or its program.sbp); a benchmark-shaped one comes from "
                     "`export --synthetic qwen3-30b-a3b --bits 4`");
  bm_src
      ->add_option("--synthetic", bm.synthetic,
                   "A benchmark shape built in memory, no export (random codes): qwen3-30b-a3b, qwen3.5-35b-a3b")
      ->check(CLI::IsMember({"qwen3-30b-a3b", "qwen3.5-35b-a3b"}));
  bm_src->require_option(1);
  bm_cmd->add_option("--layers", bm.layers, "With --synthetic: only the first N layers (default: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  bm_cmd->add_option("--bits", bm.bits, "With --synthetic: bits of every linear (2, 3, 4, 5, 6, 8)")
      ->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  bm_cmd->add_option("--group-size", bm.group_size, "With --synthetic: quantization group size")
      ->check(CLI::IsMember({32, 64, 128}));
  bm_cmd->add_option("--dtype", bm.dtype, "With --synthetic: float weights f32 | f16 | bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  bm_cmd->add_option("--max-seq", bm.max_seq, "With --synthetic: KV cache length (default: prompt + gen)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  bm_cmd->add_option("--prompt-len", bm.prompt_len, "Prompt tokens (prefill)")->check(CLI::Range(1, 8192));
  bm_cmd->add_option("--gen", bm.gen, "Generated tokens (decode steps + 1)")->check(CLI::Range(1, 8192));
  bm_cmd
      ->add_option("--prefill-runs", bm.prefill_runs,
                   "Prefills of the prompt timed before the generation's (prefill_tok_s: the median of all)")
      ->check(CLI::Range(0, 64));
  bm_cmd->add_option("--device", bm.device, "cpu | vulkan | vulkan:N (no Vulkan: the CPU, with a message)");
  bm_cmd->add_option("--threads", bm.threads, "Kernel threads (default: all cores)");
  bm_cmd->add_flag("--json", bm.json, "One JSON object on one line");

  switchboard::cli::ExportCliOptions ex;
  auto* ex_cmd = app.add_subcommand("export", "Hugging Face checkpoint (or the tiny test model) -> program + weights");
  auto* ex_src = ex_cmd->add_option_group("source", "what to export");
  ex_src->add_option("--hf", ex.hf_dir, "Hugging Face model directory (config.json + *.safetensors)");
  auto* tiny_opt = ex_src
                       ->add_option("--tiny-test", ex.tiny_family,
                                    "The deterministic random tiny model (CI, the README demo); with the value "
                                    "qwen3_5_moe the tiny Qwen3.5 hybrid")
                       ->expected(0, 1)
                       ->check(CLI::IsMember({"", "qwen2_moe", "qwen3_5_moe"}));
  ex_src
      ->add_option("--synthetic", ex.synthetic,
                   "A benchmark-shaped model with random codes (needs --bits): qwen3-30b-a3b, qwen3.5-35b-a3b")
      ->check(CLI::IsMember({"qwen3-30b-a3b", "qwen3.5-35b-a3b"}));
  ex_src->require_option(1);
  ex_cmd->add_option("--out", ex.out, "Output directory (program.sbp, weights.safetensors)")->required();
  ex_cmd->add_option("--dtype", ex.dtype, "Float weights: f32 | f16 | bf16")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  ex_cmd->add_option("--bits", ex.bits, "Quantize every linear to B bits (MLX affine): 2, 3, 4, 5, 6, 8");
  ex_cmd->add_option("--group-size", ex.group_size, "Quantization group size: 32, 64, 128");
  ex_cmd->add_option("--bit-map", ex.bit_map, "JSON {\"layer\": {\"expert\": bits}} (0 = pruned), with --bits");
  ex_cmd->add_option("--max-seq", ex.max_seq, "KV cache length (default: the config's, at most 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  ex_cmd->add_option("--layers", ex.layers, "With --synthetic: only the first N layers (default: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));

  switchboard::cli::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "Greedy generation from prompt token ids");
  run_cmd->add_option("--program", run.program, "Exported model directory (or its program.sbp)")->required();
  run_cmd->add_option("--prompt-ids", run.prompt_ids, "Comma-separated token ids, e.g. 1,2,3")->required();
  run_cmd->add_option("--max-new-tokens", run.max_new_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  run_cmd->add_option("--device", run.device, "cpu | vulkan | vulkan:N (no Vulkan: the CPU, with a message)");

  switchboard::cli::ValidateOptions val;
  auto* val_cmd = app.add_subcommand(
      "validate", "Two programs or two devices side by side: token-by-token fidelity, logits, median tok/s");
  val_cmd->add_option("--program", val.program_a, "Model A (directory or program.sbp)")->required();
  val_cmd->add_option("--program-b", val.program_b, "Model B (default: model A)");
  val_cmd->add_option("--device", val.device_a, "Device of A (cpu | vulkan | vulkan:N)");
  val_cmd->add_option("--device-b", val.device_b, "Device of B");
  val_cmd->add_option("--prompt-ids", val.prompt_ids, "Comma-separated token ids")->required();
  val_cmd->add_option("--max-new-tokens", val.max_new_tokens, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
  val_cmd->add_option("--runs", val.runs, "Timed runs per side (median reported)")->check(CLI::Range(1, 100));

  CLI11_PARSE(app, argc, argv);
  ex.tiny_test = tiny_opt->count() > 0;
  // Nothing escapes as an abort: an allocation that fails anywhere below ends the command
  // with a one-line error and exit status 1.
  try {
    if (bm_cmd->parsed()) return switchboard::cli::run_bench_model(bm);
    if (ex_cmd->parsed()) return switchboard::cli::run_export(ex);
    if (run_cmd->parsed()) return switchboard::cli::run_run(run);
    if (val_cmd->parsed()) return switchboard::cli::run_validate(val);
    if (moe_cmd->parsed()) return switchboard::cli::run_bench_moe_layer(bench);
    if (demo_cmd->parsed()) return switchboard::cli::run_demo(demo);
    if (inspect_cmd->parsed()) return switchboard::cli::run_inspect(insp);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "switchboard: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "switchboard: %s\n", e.what());
  }
  return 1;
}
