// MaskPrefetcher: computes the next step's token masks of constrained sequences on its own
// thread while the engine thread runs the forward pass (docs/ARCHITECTURE.md "Structured
// outputs"). The engine posts a job after a sequence's token is accepted and waits for all of
// them before it samples the next step; a job holds shared pointers to the matcher and the mask,
// so a request that ends meanwhile is safe to drop.
//
//   prefetcher.Post({matcher, words});   // after Accept
//   ... Forward ...
//   prefetcher.Wait();                   // before sampling: every posted mask is filled
//
// A matcher must not be used by the engine thread between Post and Wait.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/grammar/constraint.h"

namespace heavykv {

class MaskPrefetcher {
 public:
  struct Job {
    std::shared_ptr<grammar::ConstraintMatcher> matcher;
    std::shared_ptr<std::vector<uint64_t>> words;  // [vocab words], filled by the job
  };

  MaskPrefetcher();
  ~MaskPrefetcher();
  void Post(Job job);
  void Wait();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  int running_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace heavykv
