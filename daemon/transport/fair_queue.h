// The send queue of one paced rail, shared by every job's communicators on this daemon: sends
// leave at the rail's configured rate (its `pace`, docs/topology.md), and when more is waiting
// than the rate lets out, the next send is chosen by deficit round robin, across jobs by weight
// and, within a job, across its communicators equally (docs/fair-share.md).
//
// Two parts. FairSchedule is the arithmetic — virtual link time, deficits, rounds — with time
// passed in, single-threaded, so that unit tests check shares and pacing exactly. FairQueue is
// the thread-safe queue the data path uses: Submit issues at once (on the caller's thread) when
// nothing waits and the rate allows, else queues, and the queue's own thread issues each send
// when its turn and the rate come; an idle queue's thread sleeps without a timeout.
//
// Pacing is a token bucket in the form of a virtual link clock: every issued send advances the
// clock by bytes / rate from max(now, clock); a send may go when the clock is at most `burst`
// ahead of now. So a backlogged rail sends exactly `rate` on average, and an idle one sends its
// first burst without waiting. The granularity is one transport message (a schedule's chunk):
// a send is never split.
//
// The express lane: a backlogged rail's clock runs one chunk ahead of now, so a small send of a
// latency-bound job would wait for a bulk job's whole chunk at every step of its schedule. A
// send of at most `express_bytes` whose job has nothing queued on the rail leaves at once,
// ahead of the clock (which still counts its bytes, so the rail's rate holds), while the job's
// express credit covers it. Every send of a job spends its credit, which refills at the job's
// weighted share of the rate among the jobs active on the rail: a job below its share keeps
// low latency, and one sending more than its share finds its credit spent and is queued in fair
// order like any other. The lane cannot take more than a job's share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace railyard::transport {

class FairSchedule {
 public:
  struct Options {
    double rate_bytes_per_s = 0;  // > 0
    // How far the virtual link clock may run ahead of now, in bytes at rate: the largest burst
    // an idle rail sends at once. 0: max(64 KiB, 1 ms at rate).
    double burst_bytes = 0;
    // Bytes a job of weight 1 may send per round while others wait (deficit round robin's
    // quantum); a communicator inside its job gets the same per round of the job's turns.
    double quantum_bytes = 64 * 1024;
    // A job's weight (> 0); called when the job starts a round. Unset: every job weighs 1.
    std::function<double(const std::string& job)> weight;
    // The express lane (above): sends of at most this many bytes may use it; 0 turns it off.
    // A job's credit holds at most 4 such sends.
    double express_bytes = 64 * 1024;
  };
  struct Item {
    uint64_t id = 0;
    std::string job;
    std::string comm;
    size_t bytes = 0;
    int64_t enqueued_ns = 0;
  };

  explicit FairSchedule(Options options);

  // Queues an item (ids are the caller's; FIFO within one (job, comm)).
  void Enqueue(Item item);
  // True when a send of `bytes` may leave at now_ns with nothing queued ahead of it.
  bool CanSendNow(int64_t now_ns) const;
  // Accounts a send of bytes leaving at now_ns (the virtual link clock advances).
  void Sent(size_t bytes, int64_t now_ns);
  // A send of `bytes` by `job` arriving at now_ns: true when it may leave now — nothing is
  // queued and the rate allows, or it takes the express lane — and then it is accounted as
  // sent (to the clock and to the job's credit). False: the caller queues it.
  bool TrySendNow(const std::string& job, size_t bytes, int64_t now_ns);
  // Sends that took the express lane so far.
  uint64_t express_sends() const { return express_sends_; }
  // The next item to send, by deficit round robin, if the rate lets one leave at now_ns; else
  // none, and *wake_ns says when one may (or 0 when nothing is queued).
  bool Next(int64_t now_ns, Item* out, int64_t* wake_ns);
  // Removes and returns every queued item of (job, comm), in order.
  std::vector<Item> Drain(const std::string& job, const std::string& comm);
  // Removes and returns everything queued.
  std::vector<Item> DrainAll();

  bool empty() const { return queued_items_ == 0; }
  size_t queued_items() const { return queued_items_; }
  uint64_t queued_bytes() const { return queued_bytes_; }
  double rate() const { return options_.rate_bytes_per_s; }

 private:
  struct Comm {
    std::deque<Item> items;
    double deficit = 0;
    bool in_turn = false;
  };
  struct Job {
    std::map<std::string, Comm> comms;
    std::list<std::string> active;  // comms with items, in round order
    double deficit = 0;
    bool in_turn = false;
    double weight = 1;
  };
  // The communicator of j whose head item goes next within j (deficit round robin among its
  // comms; the choice stands until that item is popped).
  Comm& SelectComm(Job& j);
  // Removes that item, and j's comm when it is empty.
  Item PopJob(Job& j);
  double Weight(const std::string& job) const;
  // The express credit of each job that sent or queued on the rail lately.
  struct Recent {
    int64_t last_ns = 0;    // its last send or enqueue
    int64_t credit_ns = 0;  // when credit was last brought up to date
    double credit = 0;      // bytes; starts full
  };
  // Brings job's credit up to now_ns (refilled at its share among the active jobs) and forgets
  // jobs idle for longer than the activity window.
  Recent& RefreshCredit(const std::string& job, int64_t now_ns);
  void Spend(const std::string& job, size_t bytes, int64_t now_ns);

  Options options_;
  double express_cap_ = 0;  // bytes of credit a job may hold
  int64_t window_ns_ = 0;   // a job that has not sent for this long is not active
  std::map<std::string, Recent> recent_;
  uint64_t express_sends_ = 0;
  double burst_ns_ = 0;
  double link_free_ns_ = 0;  // the virtual link clock
  std::map<std::string, Job> jobs_;
  std::list<std::string> active_;  // jobs with items, in round order
  size_t queued_items_ = 0;
  uint64_t queued_bytes_ = 0;
};

class FairQueue {
 public:
  struct Options {
    std::string rail;  // for the thread's name and logs
    FairSchedule::Options schedule;
    // Each send as it leaves: its job, its size and how long it waited in the queue (0 for one
    // sent at once). On the thread that issues it; cheap (a counter, a histogram).
    std::function<void(const std::string& job, size_t bytes, double waited_s)> on_sent;
  };
  // Issues the send; runs exactly once, never under the queue's lock.
  using IssueFn = std::function<void()>;

  explicit FairQueue(Options options);
  ~FairQueue();  // Shutdown()
  FairQueue(const FairQueue&) = delete;
  FairQueue& operator=(const FairQueue&) = delete;

  // Issues `issue` for a send of bytes on behalf of (job, comm): on this thread now when the
  // queue is empty and the rate allows, else later on the queue's thread, in fair order.
  void Submit(const std::string& job, const std::string& comm, size_t bytes, IssueFn issue);
  // Issues everything (job, comm) has queued now, unpaced (the communicator is failing: its
  // sends fail at once and must not wait for their turn).
  void Flush(const std::string& job, const std::string& comm);
  // Stops the thread; what is still queued is issued unpaced (each send's completion still
  // runs once: the transport fails it if it is shutting down too).
  void Shutdown();

  double rate() const { return rate_; }
  size_t queued_items() const;
  uint64_t queued_bytes() const;

 private:
  void Run();
  void IssueAll(std::vector<FairSchedule::Item> items);

  const Options options_;
  const double rate_;
  mutable absl::Mutex mu_;
  FairSchedule schedule_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, IssueFn> pending_ ABSL_GUARDED_BY(mu_);  // by item id
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace railyard::transport
