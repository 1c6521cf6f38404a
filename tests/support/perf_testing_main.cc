// railyard-perf-testing: railyard-perf with --fake_device (memory of railyardd-testing's
// --fake_gpus devices). Never installed.
#include "daemon/device/fake_device_runtime.h"
#include "tools/perf/rank_worker.h"

int main(int argc, char** argv) {
  railyard::perf::PerfHooks hooks;
  hooks.fake_device_memory = [](int device, size_t bytes) {
    return railyard::device::FakeDeviceRuntime::Allocate(device, bytes);
  };
  return railyard::perf::PerfMain(argc, argv, hooks);
}
