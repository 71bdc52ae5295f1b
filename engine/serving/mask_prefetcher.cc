#include "engine/serving/mask_prefetcher.h"

namespace heavykv {

MaskPrefetcher::MaskPrefetcher() : thread_([this] { Loop(); }) {}

MaskPrefetcher::~MaskPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MaskPrefetcher::Post(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void MaskPrefetcher::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return jobs_.empty() && running_ == 0; });
}

void MaskPrefetcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    lock.unlock();
    job.matcher->FillMask(*job.words);
    lock.lock();
    --running_;
    if (jobs_.empty() && running_ == 0) done_cv_.notify_all();
  }
}

}  // namespace heavykv
