// The live sessions of one executor, for its memory report (ExecutorStats): each session counts
// itself in its executor's set while it exists. Backend-free: the CPU and CUDA executors keep one
// each, of their own session type. The engine may destroy a session on any thread, hence the lock.
#pragma once

#include <memory>
#include <mutex>
#include <set>

namespace fb::model {

template <typename S>
class LiveSessions {
 public:
  void add(const S* s) {
    std::lock_guard<std::mutex> l(mu_);
    live_.insert(s);
  }
  void remove(const S* s) {
    std::lock_guard<std::mutex> l(mu_);
    live_.erase(s);
  }
  // f(const S&) for each live session, under the lock (a session is never destroyed meanwhile).
  template <typename F>
  void for_each(F f) const {
    std::lock_guard<std::mutex> l(mu_);
    for (const S* s : live_) f(*s);
  }

 private:
  mutable std::mutex mu_;
  std::set<const S*> live_;
};

// A session's member that counts it in a LiveSessions from track() until the session is destroyed.
// A copy or a moved-to session is not counted; an assigned-to one keeps its own registration.
template <typename S>
class LiveTracker {
 public:
  LiveTracker() = default;
  LiveTracker(const LiveTracker&) {}
  LiveTracker& operator=(const LiveTracker&) { return *this; }
  ~LiveTracker() {
    if (set_) set_->remove(self_);
  }
  void track(std::shared_ptr<LiveSessions<S>> set, const S* self) {
    if (set_) set_->remove(self_);
    set_ = std::move(set);
    self_ = self;
    if (set_) set_->add(self_);
  }

 private:
  std::shared_ptr<LiveSessions<S>> set_;
  const S* self_ = nullptr;
};

}  // namespace fb::model
