// Fuzz target: the calibration the daemon reads from <state_dir>/calibration.json at start and
// the cost model it receives from a coordinator in every JoinComm answer or from Admin
// (daemon/scheduler/cost/calibration.h, daemon/core/cost_model_proto.h). The input is tried both
// as the JSON file and as a serialized railyard.v1.CostModel. Properties: a file FromJson accepts
// passes Validate; a calibration that passes Validate (from either source) is written by ToJson
// without throwing, and what ToJson writes FromJson reads back to the same calibration (what
// SaveCalibration stores, LoadCalibration loads); rejections are INVALID_ARGUMENT.
#include <cstdint>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/core/cost_model_proto.h"
#include "daemon/scheduler/cost/calibration.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace railyard {
namespace {

using scheduler::cost::Calibration;

// A calibration as deterministic bytes, to compare two field by field (doubles bitwise).
std::string Bytes(const Calibration& c) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  ToProto(c).SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

// What the daemon stores must load back as what it stored.
void CheckRoundTrip(const Calibration& c, const char* from) {
  std::string json;
  try {
    json = scheduler::cost::ToJson(c);
  } catch (const std::exception& e) {
    FUZZ_CHECK(false,
               absl::StrCat("ToJson of a valid calibration (", from, ") throws: ", e.what()));
  }
  absl::StatusOr<Calibration> back = scheduler::cost::FromJson(json);
  FUZZ_CHECK(back.ok(), absl::StrCat("the stored calibration (", from,
                                     ") does not load: ", back.status().message()));
  FUZZ_CHECK(Bytes(*back) == Bytes(c),
             absl::StrCat("the stored calibration (", from, ") loads as another one"));
}

void CheckJson(const std::string& text) {
  absl::StatusOr<Calibration> c = scheduler::cost::FromJson(text);
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument, c.status().ToString());
    return;
  }
  const absl::Status valid = scheduler::cost::Validate(*c);
  FUZZ_CHECK(valid.ok(),
             absl::StrCat("FromJson accepted an invalid calibration: ", valid.message()));
  CheckRoundTrip(*c, "file");
}

void CheckProto(const uint8_t* data, size_t size) {
  v1::CostModel model;
  if (!model.ParseFromArray(data, static_cast<int>(size))) return;
  Calibration c = FromProto(model);
  // As Tuning::SetCalibration and DaemonCommFactory::MakeTuner take it.
  if (c.source.empty()) c.source = "fit";
  if (!scheduler::cost::Validate(c).ok()) return;
  CheckRoundTrip(c, "proto");
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railyard::CheckJson(std::string(reinterpret_cast<const char*>(data), size));
  railyard::CheckProto(data, size);
  return 0;
}
