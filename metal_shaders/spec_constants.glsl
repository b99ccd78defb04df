// Specialization constants: a kernel's element dtypes (the kernel names which binding each one
// stands for) and up to three extents (rms_norm_tree's row length, attention's and rope's head
// dim, the MMA kernels' k, n and group size).
// The Vulkan host sets them to the dispatch's values, so the driver builds only that dtype's
// path with fixed loop counts: a third of the machine code, and a decode step's kernels wait on
// fetching their code. ~0u (Metal, or a dispatch that sets none): the push constants decide
// (SB_SPEC). Not for the *_dot4 row kernels, which declare their own (gather_qmm_row_dot4.glsl).
layout(constant_id = 0) const uint kSpecDt0 = 0xffffffffu;
layout(constant_id = 1) const uint kSpecDt1 = 0xffffffffu;
layout(constant_id = 2) const uint kSpecDt2 = 0xffffffffu;
layout(constant_id = 3) const uint kSpecExtent = 0xffffffffu;
layout(constant_id = 4) const uint kSpecExtent2 = 0xffffffffu;
layout(constant_id = 5) const uint kSpecExtent3 = 0xffffffffu;
