// AllReduce with railyard, whole flow: N ranks (threads here, processes in real jobs) each connect
// to the node's railyardd ($RAILYARD_SOCKET), share a buffer, join one communicator and sum.
// Usage: railyard-example-allreduce [nranks]   (default 4)
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "railyard/client.h"

using railyard::Client;
constexpr size_t kCount = 1 << 20;

absl::Status RunRank(const std::string& comm_id, int rank, int nranks) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect();  // one session per rank
  if (!client.ok()) return client.status();
  absl::StatusOr<railyard::Buffer> buf = (*client)->Allocate(kCount * sizeof(float));
  if (!buf.ok()) return buf.status();
  for (float& x : buf->span<float>()) x = static_cast<float>(rank + 1);
  absl::StatusOr<railyard::Comm> comm = (*client)->InitComm(comm_id, rank, nranks);
  if (!comm.ok()) return comm.status();
  railyard::Work work =  // in place: send == recv
      comm->AllReduce(*buf, *buf, kCount, railyard::DataType::kFloat32, railyard::RedOp::kSum);
  if (absl::Status st = work.wait(); !st.ok()) return st;
  const float want = nranks * (nranks + 1) / 2.0f;
  for (float x : buf->span<float>()) {
    if (x != want) return absl::DataLossError("got " + std::to_string(x));
  }
  if (rank == 0)
    std::printf("allreduce over %d ranks: all %zu floats = %g\n", nranks, kCount, want);
  return absl::OkStatus();
}

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? std::atoi(argv[1]) : 4;
  // Rank 0's job in a real launcher: make the id and hand it to every rank.
  absl::StatusOr<std::unique_ptr<Client>> launcher = Client::Connect();
  absl::StatusOr<std::string> comm_id =
      launcher.ok() ? (*launcher)->CreateCommId() : absl::StatusOr<std::string>(launcher.status());
  if (!comm_id.ok() || nranks < 1) {
    std::fprintf(stderr, "allreduce: %s\n",
                 nranks < 1 ? "nranks must be >= 1" : comm_id.status().ToString().c_str());
    return 1;
  }
  std::vector<std::future<absl::Status>> ranks;
  ranks.reserve(nranks);
  for (int r = 0; r < nranks; ++r) {
    ranks.push_back(std::async(std::launch::async, RunRank, *comm_id, r, nranks));
  }
  int failed = 0;
  for (int r = 0; r < nranks; ++r) {
    if (absl::Status st = ranks[r].get(); !st.ok()) {
      std::fprintf(stderr, "allreduce: rank %d: %s\n", r, st.ToString().c_str());
      failed = 1;
    }
  }
  return failed;
}
