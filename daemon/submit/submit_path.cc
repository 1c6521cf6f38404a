#include "daemon/submit/submit_path.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/comm/stream_sync.h"
#include "daemon/session/quota.h"
#include "daemon/submit/device_staging.h"
#include "daemon/submit/request_decode.h"

namespace railyard {

SubmitPath::SubmitPath(Options options, scheduler::Executor* executor)
    : options_(options),
      executor_(executor),
      gates_(options_.gate_spin, options_.gate_poll, options_.held) {}

SubmitPath::~SubmitPath() { Stop(); }

void SubmitPath::Stop() { gates_.Stop(); }

void SubmitPath::SetDevices(device::DeviceRuntime* devices, device::StagingPool* staging_pool) {
  devices_ = devices;
  staging_pool_ = staging_pool;
}

void SubmitPath::DropHeld(const Session& session, const absl::Status& why) {
  gates_.Drop(&session, why);
}

void SubmitPath::DropHeld(const Session& session, uint64_t handle, const absl::Status& why) {
  gates_.Drop(StreamGates::Key{&session, handle}, why);
}

absl::StatusOr<uint64_t> SubmitPath::Submit(const std::shared_ptr<Session>& session,
                                            const v1::SubmitRequest& req,
                                            std::shared_ptr<CompletionSink> sink) {
  absl::StatusOr<Membership> m = session->FindMembership(req.comm_handle());
  if (!m.ok()) return Refuse(*session, req, m.status());
  absl::StatusOr<std::unique_ptr<PendingRequest>> pending = Decode(session, req, *m);
  if (!pending.ok()) return pending.status();
  if (MustHold(*session, *m, req.comm_handle(), **pending)) {
    if (absl::Status st = Hold(session, *m, req.comm_handle(), sink, *std::move(pending));
        !st.ok()) {
      return st;
    }
    return 0;  // its seq comes with its completion
  }
  if (absl::Status st = Finish(session, *m, sink, pending->get()); !st.ok()) return st;
  return m->comm->Submit(*std::move(pending));
}

std::vector<absl::StatusOr<uint64_t>> SubmitPath::SubmitBatch(
    const std::shared_ptr<Session>& session, const std::vector<const v1::SubmitRequest*>& reqs,
    std::shared_ptr<CompletionSink> sink) {
  std::vector<absl::StatusOr<uint64_t>> results(reqs.size(), absl::UnknownError("not submitted"));
  size_t i = 0;
  while (i < reqs.size()) {
    const uint64_t handle = reqs[i]->comm_handle();
    absl::StatusOr<Membership> m = session->FindMembership(handle);
    if (!m.ok()) {
      results[i] = Refuse(*session, *reqs[i], m.status());
      ++i;
      continue;
    }
    // The run of requests on this communicator goes in under one lock of it.
    std::vector<std::unique_ptr<PendingRequest>> run;
    std::vector<size_t> where;
    auto flush = [&] {
      if (run.empty()) return;
      std::vector<absl::StatusOr<uint64_t>> got =
          run.size() == 1
              ? std::vector<absl::StatusOr<uint64_t>>{m->comm->Submit(std::move(run[0]))}
              : m->comm->SubmitBatch(std::move(run));
      for (size_t k = 0; k < where.size() && k < got.size(); ++k) results[where[k]] = got[k];
      run.clear();
      where.clear();
    };
    size_t j = i;
    for (; j < reqs.size() && reqs[j]->comm_handle() == handle; ++j) {
      absl::StatusOr<std::unique_ptr<PendingRequest>> pending = Decode(session, *reqs[j], *m);
      if (!pending.ok()) {
        results[j] = pending.status();
        continue;
      }
      if (MustHold(*session, *m, handle, **pending)) {
        flush();  // what came before it goes in first
        absl::Status st = Hold(session, *m, handle, sink, *std::move(pending));
        results[j] = st.ok() ? absl::StatusOr<uint64_t>(0) : absl::StatusOr<uint64_t>(st);
        continue;
      }
      if (absl::Status st = Finish(session, *m, sink, pending->get()); !st.ok()) {
        results[j] = st;
        continue;
      }
      run.push_back(*std::move(pending));
      where.push_back(j);
    }
    flush();
    i = j;
  }
  return results;
}

absl::Status SubmitPath::Refuse(const Session& session, const v1::SubmitRequest& req,
                                absl::Status why) {
  if (req.has_stream_sync()) {
    if (absl::StatusOr<StreamSync> sync = ResolveStreamSync(req.stream_sync(), session);
        sync.ok()) {
      sync->SignalDone();
    }
  }
  return why;
}

absl::StatusOr<std::unique_ptr<PendingRequest>> SubmitPath::Decode(
    const std::shared_ptr<Session>& session, const v1::SubmitRequest& req, const Membership& m) {
  auto refuse = [&](absl::Status why) { return Refuse(*session, req, std::move(why)); };
  // A client that does not read its completions gets no new work (the ones it is owed still go).
  if (const std::shared_ptr<QuotaAccount>& q = session->quota(); q != nullptr) {
    if (absl::Status s = q->CheckBelow(Resource::kCompletionBytes); !s.ok()) {
      return refuse(absl::Status(s.code(), absl::StrCat("submit refused until the client reads "
                                                        "its completions: ",
                                                        s.message())));
    }
  }
  absl::StatusOr<std::unique_ptr<PendingRequest>> pending =
      DecodeSubmit(req, *session, m.rank, m.comm->nranks());
  if (!pending.ok()) return refuse(pending.status());
  (*pending)->quota = session->quota();  // charged while it waits (communicator.cc)
  return pending;
}

void SubmitPath::RouteCompletion(const std::shared_ptr<Session>& session,
                                 const std::shared_ptr<CompletionSink>& sink,
                                 PendingRequest* pending) {
  if (sink != nullptr) {
    pending->session = sink;
  } else {
    pending->session = session;
  }
  // First: done is stored only after everything else a completion does (a staging copy back).
  AttachStreamSync(pending);
}

absl::Status SubmitPath::Finish(const std::shared_ptr<Session>& session, const Membership& m,
                                const std::shared_ptr<CompletionSink>& sink,
                                PendingRequest* pending) {
  RouteCompletion(session, sink, pending);
  if (pending->req.device >= 0 && m.comm->multi_node()) {
    // Across nodes, device memory goes through host memory (device_staging.h).
    return StageThroughHost(pending, m.comm->nranks(), devices_, staging_pool_, executor_,
                            options_.staging_chunk_bytes);
  }
  return absl::OkStatus();
}

bool SubmitPath::MustHold(const Session& session, const Membership& m, uint64_t handle,
                          const PendingRequest& pending) const {
  if (gates_.MustHold({&session, handle}, pending.sync)) return true;
  return pending.req.device >= 0 && m.comm->multi_node() &&
         StagedBytes(pending, m.comm->nranks()) > options_.staging_inline_bytes;
}

absl::Status SubmitPath::Hold(const std::shared_ptr<Session>& session, const Membership& m,
                              uint64_t handle, const std::shared_ptr<CompletionSink>& sink,
                              std::unique_ptr<PendingRequest> pending) {
  const uint64_t id = pending->request_id;
  const absl::Duration timeout = TimeoutOf(*pending, options_.op_timeout);
  std::weak_ptr<CompletionSink> target = sink != nullptr ? std::weak_ptr<CompletionSink>(sink)
                                                         : std::weak_ptr<CompletionSink>(session);
  auto held = std::make_shared<std::unique_ptr<PendingRequest>>(std::move(pending));
  // A request that never runs still ends its stream's wait: done is stored before its error.
  auto let_stream_go = [held] {
    if (*held != nullptr && (*held)->sync.has_value()) (*held)->sync->SignalDone();
  };
  auto fail = [held, target, id, let_stream_go](const absl::Status& why) {
    let_stream_go();
    held->reset();
    if (std::shared_ptr<CompletionSink> t = target.lock()) t->PostCompletion(id, why, 0);
  };
  StreamGates::Item item;
  item.gate = (*held)->sync;
  item.deadline = absl::Now() + timeout;
  std::weak_ptr<Session> weak_session = session;
  item.release = [this, weak_session, m, sink, held, fail](std::function<void()> done) {
    auto submit = [this, weak_session, m, sink, held, fail] {
      std::shared_ptr<Session> s = weak_session.lock();
      if (s == nullptr || s->closed()) return fail(absl::CancelledError("the session has ended"));
      if (absl::Status st = Finish(s, m, sink, held->get()); !st.ok()) return fail(st);
      absl::StatusOr<uint64_t> seq = m.comm->Submit(std::move(*held));
      if (!seq.ok()) fail(seq.status());
    };
    if ((*held)->req.device >= 0 && m.comm->multi_node()) {
      StageOnDevice(weak_session, m, sink, held, fail, std::move(done));
      return;
    }
    submit();
    done();
  };
  item.fail = fail;
  absl::Status st = gates_.Hold({session.get(), handle}, session->job(), std::move(item));
  if (!st.ok()) let_stream_go();  // not held: the caller reports the error
  return st;
}

void SubmitPath::StageOnDevice(std::weak_ptr<Session> weak_session, const Membership& m,
                               std::shared_ptr<CompletionSink> sink,
                               std::shared_ptr<std::unique_ptr<PendingRequest>> held,
                               std::function<void(const absl::Status&)> fail,
                               std::function<void()> done) {
  // Not on the gates' thread, which every tenant's held operations wait on. The host memory is
  // leased on a worker (a buffer the pool does not have yet is allocated and page-locked then:
  // tens of milliseconds for 64 MiB, which the device's thread would spend with every other
  // operation on that device waiting), the copy made on the device's thread a chunk per task
  // (CopyInOnDevice), so the device's other work runs in between.
  const int device = (*held)->req.device;
  executor_->Post([this, weak_session, m, sink, held, fail, done, device] {
    std::shared_ptr<Session> s = weak_session.lock();
    if (s == nullptr || s->closed()) {
      fail(absl::CancelledError("the session has ended"));
      return done();
    }
    RouteCompletion(s, sink, held->get());
    absl::StatusOr<std::unique_ptr<HostStaging>> prepared =
        HostStaging::Prepare(**held, m.comm->nranks(), staging_pool_);
    if (!prepared.ok()) {
      fail(prepared.status());
      return done();
    }
    std::shared_ptr<HostStaging> staging = *std::move(prepared);
    if (options_.staging_pipeline && !scheduler::IsPointToPoint((*held)->req.op)) {
      // Pipelined: the operation goes to its communicator now, and its steps wait for the
      // chunks they touch (the gate). A failed copy fails the steps that wait for it, and so
      // the operation, on every rank. The rank's next submission follows once this one is
      // submitted *and* copied in, as unpipelined: letting it go at once leased host memory for
      // every operation a loop issues back to back (a buffer each, allocated and page-locked
      // anew), which made 64 MiB AllReduces across nodes 1.8x slower on an H200.
      staging->Gate();
      HostStaging::Attach(staging, held->get(), devices_, executor_, options_.staging_chunk_bytes);
      auto both = std::make_shared<std::atomic<int>>(2);  // submitted, copied in: then done()
      auto one_done = [both, done] {
        if (both->fetch_sub(1, std::memory_order_acq_rel) == 1) done();
      };
      CopyInOnDevice(device, staging, [one_done](const absl::Status&) { one_done(); });
      absl::StatusOr<uint64_t> seq = m.comm->Submit(std::move(*held));
      if (!seq.ok()) fail(seq.status());
      return one_done();
    }
    CopyInOnDevice(device, staging,
                   [this, weak_session, m, held, fail, done, staging](absl::Status copied) {
                     std::shared_ptr<Session> s = weak_session.lock();
                     if (copied.ok() && (s == nullptr || s->closed())) {
                       copied = absl::CancelledError("the session has ended");
                     }
                     if (!copied.ok()) {
                       fail(copied);
                       return done();
                     }
                     HostStaging::Attach(staging, held->get(), devices_, executor_,
                                         options_.staging_chunk_bytes);
                     absl::StatusOr<uint64_t> seq = m.comm->Submit(std::move(*held));
                     if (!seq.ok()) fail(seq.status());
                     done();
                   });
  });
}

void SubmitPath::CopyInOnDevice(int device, std::shared_ptr<HostStaging> staging,
                                std::function<void(absl::Status)> then) {
  executor_->PostToDevice(device, [this, device, staging, then]() mutable {
    absl::StatusOr<bool> all = staging->CopyIn(devices_, options_.staging_chunk_bytes);
    if (!all.ok() || *all) {
      // This task's hold on the host memory ends here, not when the executor drops the task.
      staging.reset();
      return then(all.ok() ? absl::OkStatus() : all.status());
    }
    CopyInOnDevice(device, std::move(staging), std::move(then));
  });
}

}  // namespace railyard
