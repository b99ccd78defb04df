// Recorded submissions: while recording, the command buffers of the first submission are
// kept with their operands (and the scratch words to refill) instead of being reset, and
// replay() submits them again. Everything a replay needs is in device memory: what changes
// per execution comes from input copies and dynamic-value words the host rewrites.
#include <chrono>

#include "log.h"
#include "vk_context.h"
#include "vk_runtime.h"

namespace switchboard::vulkan {

struct VulkanRuntime::Recorded final : RecordedWork {
  VulkanRuntime* rt = nullptr;
  std::vector<VkCommandBuffer> cmds;
  std::vector<VkFence> fences;  // the slices' own; fences[0] waits for a replay
  Kept kept;
  uint64_t dispatches = 0;
  ~Recorded() override { rt->drop(*this); }
};

void VulkanRuntime::drop(Recorded& r) {
  Context& c = *ctx_;
  if (!r.cmds.empty()) c.vkFreeCommandBuffers(c.device, c.pool, static_cast<uint32_t>(r.cmds.size()), r.cmds.data());
  for (VkFence f : r.fences) c.vkDestroyFence(c.device, f, nullptr);
  release_kept(r.kept);
}

bool VulkanRuntime::begin_recording() {
  // The op log's per-dispatch timestamps would be replayed into a reset query pool.
  if (recording_ || capturing_ || log::op_log_enabled()) return false;
  capturing_ = true;
  capture_syncs_ = 0;
  capture_dispatches0_ = dispatches();
  keeping_fills_ = true;
  return true;
}

// The slices [0, slices) of the finished submission leave the context's reusable lists.
void VulkanRuntime::keep_recorded(uint32_t slices) {
  Context& c = *ctx_;
  auto r = std::make_unique<Recorded>();
  r->rt = this;
  r->cmds.assign(c.cmds.begin(), c.cmds.begin() + slices);
  r->fences.assign(c.fences.begin(), c.fences.begin() + slices);
  c.cmds.erase(c.cmds.begin(), c.cmds.begin() + slices);
  c.fences.erase(c.fences.begin(), c.fences.begin() + slices);
  r->kept = take_kept();
  captured_ = std::move(r);
}

std::unique_ptr<RecordedWork> VulkanRuntime::end_recording() {
  capturing_ = false;
  keeping_fills_ = false;
  std::unique_ptr<RecordedWork> r = std::move(captured_);
  if (!r || capture_syncs_ != 1) return nullptr;  // nothing submitted, or split by a sync
  static_cast<Recorded&>(*r).dispatches = dispatches() - capture_dispatches0_;
  return r;
}

Status VulkanRuntime::replay(const RecordedWork& work) {
  const auto& r = static_cast<const Recorded&>(work);
  SB_CHECK_OR_RETURN(!recording_ && !capturing_ && r.rt == this, StatusCode::kInternal,
                     "replay: work is being recorded, or the work is another runtime's");
  Context& c = *ctx_;
  refill(r.kept);
  per_dispatch_timing_ = false;
  if (c.timestamps) c.vkResetQueryPool(c.device, c.timestamps, 0, 2);
  record_start_ = Clock::now();
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = static_cast<uint32_t>(r.cmds.size());
  si.pCommandBuffers = r.cmds.data();
  SB_VK_CHECK(c.vkQueueSubmit(c.queue, 1, &si, r.fences[0]), "vkQueueSubmit");
  last_record_us_ = std::chrono::duration<double, std::micro>(Clock::now() - record_start_).count();
  // A decode step is a few ms: poll the fence (a blocking wait wakes up late), then block.
  const auto poll_until = Clock::now() + std::chrono::milliseconds(50);
  VkResult fs = c.vkGetFenceStatus(c.device, r.fences[0]);
  while (fs == VK_NOT_READY && Clock::now() < poll_until) fs = c.vkGetFenceStatus(c.device, r.fences[0]);
  if (fs != VK_SUCCESS)
    SB_VK_CHECK(c.vkWaitForFences(c.device, 1, &r.fences[0], VK_TRUE, UINT64_MAX), "vkWaitForFences");
  c.vkResetFences(c.device, 1, &r.fences[0]);
  log_timestamps();
  count_replayed(r.dispatches);
  return gpu::status_from_error_bits(finish_submission());
}

}  // namespace switchboard::vulkan
