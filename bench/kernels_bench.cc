// Microbenchmarks for the CPU reduction kernels (daemon/kernels/reduce.h).
//
// bytes_per_second counts memory traffic: every source read once plus the destination(s) written
// once, i.e. (nsrcs + ndsts) * bytes per buffer; memcpy counts read + write. The "per_buf" counter
// is the bytes of one buffer per second (the algorithm bandwidth, as nccl-tests would call it).
// Crc32c: the data plane's checksum (GB/s of data checksummed).
// Codec encode / DecodeAdd / EncodeWithFeedback (daemon/kernels/codec.h): GB/s of float32 input,
// on Gaussian values (the magnitudes top-k selects among matter; a repeating pattern would be all
// ties).
// Run e.g.: kernels_bench --benchmark_filter='F32Sum|Memcpy' --benchmark_min_time=1

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/kernels/codec.h"
#include "daemon/kernels/reduce.h"
#include "daemon/kernels/types.h"
#include "daemon/transport/crc32c.h"

namespace railyard::kernels {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A buffer of `bytes` bytes filled with small values valid in every dtype (1.0 in f32/f16/bf16
// bit patterns are not needed: any finite bit pattern is fine for timing, but avoid NaN/denormal
// slow paths by using a repeating pattern of small positive values).
std::vector<uint8_t> MakeBuffer(DataType dtype, size_t bytes) {
  std::vector<uint8_t> buf(bytes);
  const size_t esize = ElementSize(dtype);
  const size_t count = bytes / esize;
  for (size_t i = 0; i < count; ++i) {
    const float v = 1.0f + static_cast<float>(i % 7) * 0.125f;
    uint8_t* p = buf.data() + i * esize;
    switch (dtype) {
      case DataType::kFloat32: {
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::kFloat64: {
        const double d = v;
        std::memcpy(p, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t b = FloatToBFloat16(v);
        std::memcpy(p, &b, 2);
        break;
      }
      default: {
        const uint64_t x = i % 7 + 1;
        std::memcpy(p, &x, esize);  // little-endian: the low bytes
        break;
      }
    }
  }
  return buf;
}

void SetRates(benchmark::State& state, size_t bytes_per_buf, int nbufs_touched) {
  const auto iters = static_cast<int64_t>(state.iterations());
  state.SetBytesProcessed(iters * static_cast<int64_t>(bytes_per_buf) * nbufs_touched);
  state.counters["per_buf"] =
      benchmark::Counter(static_cast<double>(bytes_per_buf) * iters, benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1024);
}

// Args: {MiB per buffer, nsrcs, in_place (dst == srcs[0])}.
template <DataType kType, RedOp kOp>
void BM_Reduce(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * kMiB;
  const int nsrcs = static_cast<int>(state.range(1));
  const bool in_place = state.range(2) != 0;
  const size_t count = bytes / ElementSize(kType);
  std::vector<std::vector<uint8_t>> srcs_buf;
  for (int s = 0; s < nsrcs; ++s) srcs_buf.push_back(MakeBuffer(kType, bytes));
  std::vector<uint8_t> dst_buf(bytes, 0);
  std::vector<const void*> srcs;
  for (const auto& b : srcs_buf) srcs.push_back(b.data());
  void* dst = in_place ? srcs_buf[0].data() : dst_buf.data();
  const uint32_t div = static_cast<uint32_t>(nsrcs);
  for (auto _ : state) {
    Reduce(kType, kOp, dst, srcs.data(), nsrcs, count, div);
    benchmark::ClobberMemory();
  }
  SetRates(state, bytes, nsrcs + 1);
}

// Args: {MiB per buffer, nsrcs, ndsts}.
void BM_ReduceToManyF32Sum(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * kMiB;
  const int nsrcs = static_cast<int>(state.range(1));
  const int ndsts = static_cast<int>(state.range(2));
  const size_t count = bytes / 4;
  std::vector<std::vector<uint8_t>> bufs;
  for (int i = 0; i < nsrcs + ndsts; ++i) bufs.push_back(MakeBuffer(DataType::kFloat32, bytes));
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  for (int i = 0; i < nsrcs; ++i) srcs.push_back(bufs[i].data());
  for (int i = 0; i < ndsts; ++i) dsts.push_back(bufs[nsrcs + i].data());
  for (auto _ : state) {
    ReduceToMany(DataType::kFloat32, RedOp::kSum, dsts.data(), ndsts, srcs.data(), nsrcs, count, 1);
    benchmark::ClobberMemory();
  }
  SetRates(state, bytes, nsrcs + ndsts);
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * kMiB;
  std::vector<uint8_t> src = MakeBuffer(DataType::kUint8, bytes), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  SetRates(state, bytes, 2);
}

void BM_Swap(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * kMiB;
  std::vector<uint8_t> a = MakeBuffer(DataType::kUint8, bytes), b(bytes, 1);
  for (auto _ : state) {
    Swap(a.data(), b.data(), bytes);
    benchmark::ClobberMemory();
  }
  SetRates(state, bytes, 4);  // both regions read and written
}

// CRC-32C of one buffer (the data plane's per-chunk check, daemon/transport/crc32c.h):
// bytes_per_second is the bytes checksummed. impl: 0 portable table, 1 one crc32 stream,
// 2 three interleaved streams (what Crc32c uses with SSE4.2).
void BM_Crc32c(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * 1024;
  const int impl = static_cast<int>(state.range(1));
  if (impl > 0 && !transport::Crc32cHardwareAvailable()) {
    state.SkipWithError("no SSE4.2 crc32 on this CPU");
    return;
  }
  std::vector<uint8_t> buf = MakeBuffer(DataType::kUint8, bytes);
  uint32_t crc = 0;
  for (auto _ : state) {
    crc = impl == 0   ? transport::Crc32cPortable(buf.data(), bytes, crc)
          : impl == 1 ? transport::Crc32cHardwareSimple(buf.data(), bytes, crc)
                      : transport::Crc32cHardware(buf.data(), bytes, crc);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void ReduceArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"MiB", "nsrcs", "inplace"});
  for (int64_t mib : {1, 64}) {
    for (int64_t nsrcs : {2, 4}) b->Args({mib, nsrcs, 0});
  }
  b->Args({64, 2, 1});
  b->Args({64, 8, 0});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

void ShortReduceArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"MiB", "nsrcs", "inplace"});
  b->Args({1, 4, 0});
  b->Args({64, 4, 0});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

const char* const kCodecs[] = {"fp16", "bf16", "int8", "topk:0.01"};

// arg 0: codec (kCodecs), 1: MiB of float32, 2: 0 encode, 1 DecodeAdd, 2 EncodeWithFeedback.
void BM_Codec(benchmark::State& state) {
  const Codec codec = *ParseCodec(kCodecs[state.range(0)]);
  const size_t n = static_cast<size_t>(state.range(1)) * kMiB / 4;
  std::vector<float> x(n), acc(n, 0.0f), residual(n, 0.0f);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : x) v = d(rng);
  std::vector<uint8_t> wire(EncodedBytes(codec, n));
  std::vector<uint32_t> scratch(n);
  Encode(codec, x.data(), n, wire.data(), scratch.data());
  for (auto _ : state) {
    switch (state.range(2)) {
      case 0:
        Encode(codec, x.data(), n, wire.data(), scratch.data());
        break;
      case 1:
        if (!DecodeAdd(codec, wire.data(), wire.size(), n, acc.data()).ok())
          state.SkipWithError("decode");
        break;
      default:
        EncodeWithFeedback(codec, x.data(), residual.data(), n, wire.data(), scratch.data());
        break;
    }
    benchmark::DoNotOptimize(wire.data());
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(kCodecs[state.range(0)]) + (state.range(2) == 0 ? " encode"
                                                         : state.range(2) == 1
                                                             ? " decode-add"
                                                             : " encode+feedback"));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(4 * n));
}

BENCHMARK(BM_Codec)
    ->Name("Codec")
    ->ArgNames({"codec", "MiB", "mode"})
    ->ArgsProduct({{0, 1, 2, 3}, {16}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Crc32c)
    ->Name("Crc32c")
    ->ArgNames({"KiB", "impl"})
    ->ArgsProduct({{4, 256, 65536}, {0, 1, 2}})
    ->UseRealTime();
BENCHMARK(BM_Reduce<DataType::kFloat32, RedOp::kSum>)->Name("F32Sum")->Apply(ReduceArgs);
BENCHMARK(BM_Reduce<DataType::kBFloat16, RedOp::kSum>)->Name("BF16Sum")->Apply(ReduceArgs);
BENCHMARK(BM_Reduce<DataType::kFloat16, RedOp::kSum>)->Name("F16Sum")->Apply(ShortReduceArgs);
BENCHMARK(BM_Reduce<DataType::kFloat64, RedOp::kSum>)->Name("F64Sum")->Apply(ShortReduceArgs);
BENCHMARK(BM_Reduce<DataType::kFloat32, RedOp::kMax>)->Name("F32Max")->Apply(ShortReduceArgs);
BENCHMARK(BM_Reduce<DataType::kInt32, RedOp::kSum>)->Name("I32Sum")->Apply(ShortReduceArgs);
BENCHMARK(BM_Reduce<DataType::kFloat32, RedOp::kAvg>)->Name("F32Avg")->Apply(ShortReduceArgs);
BENCHMARK(BM_ReduceToManyF32Sum)
    ->Name("F32SumToMany")
    ->ArgNames({"MiB", "nsrcs", "ndsts"})
    ->Args({64, 4, 3})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Memcpy)->Name("Memcpy")->ArgName("MiB")->Arg(1)->Arg(64)->UseRealTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_Swap)->Name("Swap")->ArgName("MiB")->Arg(64)->UseRealTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
}  // namespace railyard::kernels

BENCHMARK_MAIN();
