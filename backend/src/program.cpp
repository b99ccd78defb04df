// Program (load + resolve constants) and Session (the public execution API).
#include <algorithm>
#include <cstdlib>

#include "device_registry.h"
#include "env.h"
#include "interpreter.h"
#include "log.h"
#include "no_throw.h"

namespace switchboard {

const char* version() { return "0.1.0"; }

namespace {

IoInfo io_info(const fb::ProgramT& ir, const fb::IoSlotT& io) {
  IoInfo info;
  info.name = io.name;
  info.is_tensor = io.kind == fb::SlotKind::Tensor;
  if (info.is_tensor) {
    const fb::TensorMetaT& m = *ir.tensor_meta[io.idx];
    info.dtype = static_cast<DType>(m.dtype);
    for (const auto& d : m.shape) info.shape.push_back(DimInfo{d->size, d->min, d->max});
  } else {
    info.dtype = DType::kI64;
  }
  return info;
}

Shape static_shape(const fb::TensorMetaT& m) {
  Shape s;
  for (const auto& d : m.shape) s.push_back(d->size);
  return s;
}

// Finds each named constant in the weights files (first file wins) and checks
// that its dtype and shape equal the program's declaration.
Status resolve_constants(detail::ProgramImpl& p, const LoadOptions& options) {
  const std::vector<std::string>& paths = options.weights;
  const auto& in_memory = options.constants;
  for (const std::string& path : paths) {
    SB_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path, options.weights_access));
    p.weights.push_back(std::move(file));
  }
  SB_CHECK_OR_RETURN(!options.verify_weights || !p.weights.empty(), StatusCode::kInvalidArgument,
                     "%s: LoadOptions::verify_weights needs a weights file", p.origin.c_str());
  // The first file is the one an export writes beside the program.
  if (!p.weights.empty() && (options.check_weights_fingerprint || options.verify_weights))
    SB_RETURN_IF_ERROR(check_weights_record(p, *p.weights[0], options.verify_weights));
  const fb::ProgramT& ir = *p.ir;
  for (size_t i = 0; i < ir.constants.size(); ++i) {
    const fb::NamedTensorT& c = *ir.constants[i];
    uint32_t tid = c.tid->idx();
    const fb::TensorMetaT& m = *ir.tensor_meta[tid];
    Shape want = static_shape(m);
    auto mem = std::find_if(in_memory.begin(), in_memory.end(), [&](const auto& kv) { return kv.first == c.name; });
    if (mem != in_memory.end()) {
      const Tensor& t = mem->second;
      if (t.dtype() != static_cast<DType>(m.dtype) || t.shape() != want)
        return make_error(StatusCode::kInvalidWeights, "constants[%zu] '%s': given %s %s, the program declares %s %s",
                          i, c.name.c_str(), dtype_name(t.dtype()), shape_str(t.shape()).c_str(),
                          dtype_name(static_cast<DType>(m.dtype)), shape_str(want).c_str());
      p.constants[tid] = t;
      continue;
    }
    const SafetensorsFile* found = nullptr;
    for (const auto& f : p.weights)
      if (f->entries().count(c.name)) {
        found = f.get();
        break;
      }
    if (!found) {
      std::string where = paths.empty() ? std::string("no weights file was given") : "not in " + paths[0];
      for (size_t k = 1; k < paths.size(); ++k) where += ", " + paths[k];
      return make_error(StatusCode::kNotFound, "constants[%zu] '%s': %s", i, c.name.c_str(), where.c_str());
    }
    const SafetensorsEntry& e = found->entries().at(c.name);
    if (e.dtype != static_cast<DType>(m.dtype) || e.shape != want)
      return make_error(StatusCode::kInvalidWeights, "%s: tensor '%s' is %s %s, the program declares %s %s",
                        found->path().c_str(), c.name.c_str(), dtype_name(e.dtype), shape_str(e.shape).c_str(),
                        dtype_name(static_cast<DType>(m.dtype)), shape_str(want).c_str());
    SB_ASSIGN_OR_RETURN(p.constants[tid], found->tensor(c.name));
  }
  p.constants_resolved = true;
  return Status::ok();
}

}  // namespace

Program::Program() : impl_(std::make_unique<detail::ProgramImpl>()) {}
Program::~Program() = default;

Result<std::shared_ptr<const Program>> Program::load(const std::string& path, const LoadOptions& options) {
  return no_throw(path, [&]() -> Result<std::shared_ptr<const Program>> {
    SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file(path));
    return from_bytes(std::move(bytes), path, options);
  });
}

Result<std::shared_ptr<const Program>> Program::from_bytes(std::vector<uint8_t> bytes, const std::string& origin,
                                                           const LoadOptions& options) {
  return no_throw(origin, [&]() -> Result<std::shared_ptr<const Program>> {
    FileHeader header{};
    auto ir = parse_program(bytes, &header);
    if (!ir.is_ok()) return ir.status().annotate(origin);
    std::shared_ptr<Program> prog(new Program());
    detail::ProgramImpl& p = *prog->impl_;
    p.header = header;
    p.origin = origin;
    p.ir = std::move(ir).value();
    p.roles.assign(p.ir->num_tensor_slots, SlotRole::kTemp);
    for (const auto& c : p.ir->constants) p.roles[c->tid->idx()] = SlotRole::kConstant;
    for (const auto& m : p.ir->mutable_buffers) p.roles[m->tid->idx()] = SlotRole::kMutable;
    for (const auto& io : p.ir->inputs)
      if (io->kind == fb::SlotKind::Tensor) p.roles[io->idx] = SlotRole::kInput;
    for (const auto& io : p.ir->inputs) p.inputs.push_back(io_info(*p.ir, *io));
    for (const auto& io : p.ir->outputs) p.outputs.push_back(io_info(*p.ir, *io));
    p.constants.resize(p.ir->num_tensor_slots);
    if (options.resolve_constants) SB_RETURN_IF_ERROR(resolve_constants(p, options));
    log::debug("loaded {}: {} inputs, {} outputs, {} constants", origin, p.inputs.size(), p.outputs.size(),
               p.ir->constants.size());
    return std::shared_ptr<const Program>(std::move(prog));
  });
}

const std::vector<IoInfo>& Program::inputs() const { return impl_->inputs; }
const std::vector<IoInfo>& Program::outputs() const { return impl_->outputs; }

bool Program::attribute(std::string_view name, int64_t* value) const {
  for (const auto& a : impl_->ir->attributes)
    if (a->name == name) {
      *value = a->value;
      return true;
    }
  return false;
}

namespace {
// A mapped weights file that shrank under us reads as zeros (core/mapped_file.h): whatever
// was computed since is discarded, and so is every later result of this program.
Status check_weights_unchanged(const detail::ProgramImpl& p) {
  for (const auto& f : p.weights)
    SB_CHECK_OR_RETURN(!f->changed_on_disk(), StatusCode::kIoError,
                       "%s: changed on disk (truncated?) while mapped; the result is discarded. Load the program "
                       "again (or with WeightsAccess::kRead, which copies the weights)",
                       f->path().c_str());
  return Status::ok();
}

// Mutable-buffer sizes come from the (untrusted) program, so they are bounded
// before the session allocates them.
// `what` names the limit in the error (the option, or the device's free memory).
Status check_buffer_bytes(const detail::ProgramImpl& p, uint64_t limit, const std::string& what) {
  uint64_t total = 0;
  for (const auto& mb : p.ir->mutable_buffers) {
    const fb::TensorMetaT& m = *p.ir->tensor_meta[mb->tid->idx()];
    uint64_t bytes = dtype_size(static_cast<DType>(m.dtype));
    for (const auto& d : m.shape) {
      uint64_t n = static_cast<uint64_t>(d->size);
      bytes = (n != 0 && bytes > (limit + 1) / n) ? limit + 1 : bytes * n;  // saturate past the limit
    }
    total = total + bytes > limit ? limit + 1 : total + bytes;
    SB_CHECK_OR_RETURN(total <= limit, StatusCode::kOutOfRange,
                       "%s: mutable buffers need more than %llu bytes (%s), reached at '%s'", p.origin.c_str(),
                       static_cast<unsigned long long>(limit), what.c_str(), mb->name.c_str());
  }
  return Status::ok();
}

// The session's device policy: each option it leaves unset comes from the environment.
DeviceOptions device_options(const SessionOptions& o) {
  DeviceOptions d = default_device_options();
  d.gpu_int8_mma = o.gpu_int8_mma.value_or(d.gpu_int8_mma);
  d.gpu_int_dot = o.gpu_int_dot.value_or(d.gpu_int_dot);
  d.gpu_handoff = o.gpu_handoff.value_or(d.gpu_handoff);
  d.gpu_specialize = o.gpu_specialize.value_or(d.gpu_specialize);
  d.pipeline_stats = o.pipeline_stats.value_or(d.pipeline_stats);
  d.gpu_flush_bytes = o.gpu_flush_bytes.value_or(d.gpu_flush_bytes);
  if (o.spirv_dir) d.spirv_dir = *o.spirv_dir;
  if (o.gpu_repeat) d.gpu_repeat = *o.gpu_repeat;
  if (o.gpu_timeline) d.gpu_timeline = *o.gpu_timeline;
  return d;
}

}  // namespace

Session::Session() = default;
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Program> program,
                                                 const SessionOptions& options) {
  return no_throw("Session::create", [&]() -> Result<std::unique_ptr<Session>> {
    SB_CHECK_OR_RETURN(program != nullptr, StatusCode::kInvalidArgument, "Session::create: null program");
    SB_CHECK_OR_RETURN(program->impl().constants_resolved, StatusCode::kInvalidArgument,
                       "%s: constants were not resolved (loaded with resolve_constants = false)",
                       program->impl().origin.c_str());
    SB_RETURN_IF_ERROR(
        check_buffer_bytes(program->impl(), options.max_buffer_bytes, "SessionOptions::max_buffer_bytes"));
    SB_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                        open_device(options.device, options.cpu_fallback, device_options(options)));
    // Before anything is zero-filled: a claim the device cannot hold fails here, naming the slot.
    if (const uint64_t free = device->available_memory(); free > 0 && free < options.max_buffer_bytes)
      SB_RETURN_IF_ERROR(
          check_buffer_bytes(program->impl(), free, "the memory of device '" + device->name() + "'"));
    std::unique_ptr<Session> s(new Session());
    s->program_ = program;
    s->interp_ = std::make_unique<detail::Interpreter>(program->impl(), std::move(device),
                                                       options.gpu_replay.value_or(env_defaults().gpu_replay));
    SB_RETURN_IF_ERROR(s->interp_->plan());
    SB_RETURN_IF_ERROR(s->interp_->reset());
    SB_RETURN_IF_ERROR(check_weights_unchanged(program->impl()));
    return s;
  });
}

namespace {
template <class List>
Result<size_t> find_io(const List& list, std::string_view name, const char* what) {
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i]->name == name) return i;
  return make_error(StatusCode::kNotFound, "no %s named '%.*s'", what, static_cast<int>(name.size()), name.data());
}
}  // namespace

Status Session::set_input(std::string_view name, Tensor value) {
  SB_ASSIGN_OR_RETURN(size_t i, find_io(program_->impl().ir->inputs, name, "input"));
  SB_CHECK_OR_RETURN(program_->impl().ir->inputs[i]->kind == fb::SlotKind::Tensor, StatusCode::kInvalidArgument,
                     "input '%s' is a value; use set_input_value", program_->impl().ir->inputs[i]->name.c_str());
  return interp_->set_input(i, std::move(value));
}

Status Session::set_input_value(std::string_view name, int64_t value) {
  SB_ASSIGN_OR_RETURN(size_t i, find_io(program_->impl().ir->inputs, name, "input"));
  SB_CHECK_OR_RETURN(program_->impl().ir->inputs[i]->kind == fb::SlotKind::Value, StatusCode::kInvalidArgument,
                     "input '%s' is a tensor; use set_input", program_->impl().ir->inputs[i]->name.c_str());
  return interp_->set_input_value(i, value);
}

Status Session::execute() {
  return no_throw("execute", [&] {
    Status st = interp_->execute();
    SB_RETURN_IF_ERROR(check_weights_unchanged(program_->impl()));
    return st;
  });
}

Result<Tensor> Session::output(std::string_view name) const {
  SB_ASSIGN_OR_RETURN(size_t i, find_io(program_->impl().ir->outputs, name, "output"));
  const fb::IoSlotT& io = *program_->impl().ir->outputs[i];
  SB_CHECK_OR_RETURN(io.kind == fb::SlotKind::Tensor, StatusCode::kInvalidArgument,
                     "output '%s' is a value; use output_value", io.name.c_str());
  return interp_->tensor_slot(io.idx);
}

Result<int64_t> Session::output_value(std::string_view name) const {
  SB_ASSIGN_OR_RETURN(size_t i, find_io(program_->impl().ir->outputs, name, "output"));
  const fb::IoSlotT& io = *program_->impl().ir->outputs[i];
  SB_CHECK_OR_RETURN(io.kind == fb::SlotKind::Value, StatusCode::kInvalidArgument,
                     "output '%s' is a tensor; use output", io.name.c_str());
  SB_ASSIGN_OR_RETURN(detail::Value v, interp_->value_slot(io.idx));
  return v.is_float ? static_cast<int64_t>(v.f) : v.i;
}

Result<Tensor> Session::mutable_buffer(std::string_view name) const {
  SB_ASSIGN_OR_RETURN(size_t i, find_io(program_->impl().ir->mutable_buffers, name, "mutable buffer"));
  return interp_->tensor_slot(program_->impl().ir->mutable_buffers[i]->tid->idx());
}

Status Session::reset() { return interp_->reset(); }

const std::string& Session::device_name() const { return interp_->device_name(); }
const std::string& Session::device_description() const { return interp_->device_description(); }
double Session::last_device_time_us() const { return interp_->last_device_us(); }
double Session::last_record_time_us() const { return interp_->last_record_us(); }
double Session::last_kernel_time_us() const { return interp_->last_kernel_us(); }
uint64_t Session::device_dispatches() const { return interp_->device_dispatches(); }
bool Session::last_execute_replayed() const { return interp_->last_replayed(); }

}  // namespace switchboard
