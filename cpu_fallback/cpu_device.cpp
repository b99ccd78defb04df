// The CPU fallback device: every op's reference kernel.
#include "cpu_device.h"

#include "cpu_common.h"
#include "file_io.h"

namespace switchboard {
namespace cpu {

namespace {
class CpuDevice final : public Device {
 public:
  CpuDevice() {
    register_elementwise_kernels(registry_);
    register_cast_kernels(registry_);
    register_shape_kernels(registry_);
    register_matmul_kernels(registry_);
    register_reduce_kernels(registry_);
    register_gather_qmm_kernels(registry_);
    register_gather_mm_kernels(registry_);
    register_router_kernels(registry_);
    register_permute_kernels(registry_);
    register_glu_kernels(registry_);
    register_combine_kernels(registry_);
    register_norm_kernels(registry_);
    register_attention_kernels(registry_);
    register_rope_kernels(registry_);
    register_linear_attention_kernels(registry_);
  }
  const std::string& name() const override { return name_; }
  const KernelRegistry& kernels() const override { return registry_; }
  uint64_t available_memory() const override { return host_memory_available(); }

 private:
  std::string name_ = "cpu";
  KernelRegistry registry_;
};
}  // namespace
}  // namespace cpu

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<cpu::CpuDevice>(); }

}  // namespace switchboard
