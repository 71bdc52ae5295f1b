// SlotChannel: what a KV slot's metadata channel holds, i.e. what the kernels write into it while
// they attend or append. An eviction policy (memory/eviction_policy.h) declares one ChannelSpec;
// the CPU attention (kernels/cpu/paged_attention.h) and the K/V append write it; KvCache moves it
// with its slot on compaction. Values are per (layer, kv head, slot), and "received" below is the
// attention probability a slot got from one query, summed over the query heads of the kv head's
// group (so the mean over the n visible slots is group / n).
#pragma once

#include <cstdint>

namespace heavykv {

enum class SlotChannel : int32_t {
  kNone = 0,           // unused; its value is undefined
  kAccumulated,        // += received, every query (h2o)
  kLast,               // = received from the latest query that saw the slot (tova)
  kAboveMeanCount,     // = decay * value + (received > mean ? 1 : 0), every query (scissorhands)
  kObservationWindow,  // += received, only from the last `window` queries of a step (snapkv)
  kNegKeyNorm,         // = -||k||_2 of the slot's key (after RoPE), written once at append (knorm)
};

struct ChannelSpec {
  SlotChannel kind = SlotChannel::kNone;
  float decay = 1.0f;  // kAboveMeanCount: the factor applied to the count before each query
  int32_t window = 0;  // kObservationWindow: how many of a step's last queries add to it
};

// Whether attention (as opposed to the append) writes this channel.
inline bool AttentionWrites(SlotChannel kind) {
  return kind == SlotChannel::kAccumulated || kind == SlotChannel::kLast ||
         kind == SlotChannel::kAboveMeanCount || kind == SlotChannel::kObservationWindow;
}

}  // namespace heavykv
