// railyardd-testing: railyardd with the test hooks (daemon/test_hooks.h), for the tests and for
// trying the device paths on hosts without a GPU. Never installed.
//   --fake_gpus=N           N fake devices whose memory is memfds (fake_device_runtime.h)
//   --test_flip_bit_every=N one bit of every Nth data message to another daemon flipped under
//                           the frame (bit_flip_endpoint.h), for the integrity tests
#include <cstdint>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/daemon_main.h"
#include "daemon/device/fake_device_runtime.h"
#include "daemon/scheduler/tags.h"
#include "daemon/transport/bit_flip_endpoint.h"
#include "daemon/transport/framed_endpoint.h"

int main(int argc, char** argv) {
  using railyard::transport::Endpoint;
  railyard::TestHooks hooks;
  hooks.fake_devices = [](int devices) -> std::unique_ptr<railyard::device::DeviceRuntime> {
    return std::make_unique<railyard::device::FakeDeviceRuntime>(devices);
  };
  hooks.flip_bits = [](uint64_t every) -> railyard::transport::LinkStack::WireLayer {
    return [every](std::shared_ptr<Endpoint> wire, int rail) -> std::shared_ptr<Endpoint> {
      // The daemons' operation digests (and what they carry) are not data: left alone, so the
      // flips land in what the schedules move.
      auto spare = [](railyard::transport::Tag tag) {
        const railyard::scheduler::tags::Fields f = railyard::scheduler::tags::Decode(tag);
        return !f.point_to_point && f.step == railyard::scheduler::tags::kDigestStep;
      };
      return std::make_shared<railyard::transport::BitFlipEndpoint>(
          std::move(wire), every, absl::ToUnixNanos(absl::Now()) + rail,
          railyard::transport::kFrameTrailerSize, spare);
    };
  };
  return railyard::RunDaemon(argc, argv, hooks);
}
