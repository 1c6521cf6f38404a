#include "daemon/core/cost_model_proto.h"

namespace railyard {

v1::CostModel ToProto(const scheduler::cost::Calibration& c) {
  v1::CostModel m;
  m.set_intra_alpha_s(c.intra.alpha_s);
  m.set_intra_beta_bytes_per_s(c.intra.beta_bytes_per_s);
  m.set_inter_alpha_s(c.inter.alpha_s);
  m.set_inter_beta_bytes_per_s(c.inter.beta_bytes_per_s);
  m.set_overhead_s(c.overhead_s);
  m.set_op_overhead_s(c.op_overhead_s);
  m.set_message_cpu_s(c.message_cpu_s);
  m.set_reduce_bytes_per_s(c.reduce_bytes_per_s);
  m.set_source(c.source);
  m.set_op(c.op);
  m.set_algorithm(c.algorithm);
  m.set_placement(c.placement);
  m.set_topology(c.topology);
  m.set_fitted_at(c.fitted_at);
  m.set_nranks(c.nranks);
  m.set_nnodes(c.nnodes);
  m.set_samples(c.samples);
  m.set_rms_relative_error(c.rms_relative_error);
  return m;
}

scheduler::cost::Calibration FromProto(const v1::CostModel& m) {
  scheduler::cost::Calibration c;
  c.intra = {m.intra_alpha_s(), m.intra_beta_bytes_per_s()};
  c.inter = {m.inter_alpha_s(), m.inter_beta_bytes_per_s()};
  c.overhead_s = m.overhead_s();
  c.op_overhead_s = m.op_overhead_s();
  c.message_cpu_s = m.message_cpu_s();
  c.reduce_bytes_per_s = m.reduce_bytes_per_s();
  c.source = m.source();
  c.op = m.op();
  c.algorithm = m.algorithm();
  c.placement = m.placement();
  c.topology = m.topology();
  c.fitted_at = m.fitted_at();
  c.nranks = m.nranks();
  c.nnodes = m.nnodes();
  c.samples = m.samples();
  c.rms_relative_error = m.rms_relative_error();
  return c;
}

}  // namespace railyard
