// What only a test build of railyardd adds (railyardd-testing, tests/support/): fake devices and
// fault injection. The installed railyardd is built with none of it (no fake device runtime, no
// bit flips are linked into it) and refuses the flags that need it (daemon_main.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "daemon/device/device_runtime.h"
#include "daemon/transport/link_stack.h"

namespace railyard {

struct TestHooks {
  // --fake_gpus=N: a device runtime of N fake devices (device memory in memfds).
  std::function<std::unique_ptr<device::DeviceRuntime>(int devices)> fake_devices;
  // --test_flip_bit_every=N: the wire layer of every link to another daemon, flipping one bit of
  // every Nth data message under the frame.
  std::function<transport::LinkStack::WireLayer(uint64_t every)> flip_bits;
};

}  // namespace railyard
