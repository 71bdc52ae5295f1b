// Internal to paged_attention.cc: the attention paths compiled in their own source files. Not for
// other callers: use PagedAttention / PagedAttentionWith (paged_attention.h).
#pragma once

#include "kernels/cpu/paged_attention.h"

namespace heavykv::cpu::internal {

// AVX2 + FMA (paged_attention_avx2.cc): any head_dim that is a multiple of 8.
bool Avx2Handles(const AttentionArgs& args);
void PagedAttentionAvx2(const AttentionArgs& args, float* scratch);

}  // namespace heavykv::cpu::internal
