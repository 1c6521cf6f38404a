#include "daemon/scheduler/cost/closed_form.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace railyard::scheduler::cost {
namespace {

using topology::FabricKind;
using topology::FabricSpec;
using topology::LinkClass;

// The link figures every formula below uses, derived once from the fabric.
struct Links {
  int n = 1, k = 1, g = 1, r = 1;
  double a_intra = 0, b_intra = 0;  // inside a node
  double a = 0, b = 0;              // between nodes, per NIC
  double a_hop = 0, b_hop = 0;      // a flat algorithm's hop: the slowest of the classes it uses
  double b_cross = 0;  // per rank when every local rank crosses the node at once (NICs shared)
  double o = 0;
};

// The NIC bandwidth one rank has across nodes, in NICs: with at least as many ranks per node as
// rails, G/R ranks share each rail (R/G); with fewer, each rank stripes its transfers over
// floor(R/G) rails or more (CommLayout::rail_for), so the slowest has floor(R/G).
double NicShare(int r, int g) {
  return g >= r ? static_cast<double>(r) / g : static_cast<double>(r / g);
}

Links Derive(const FabricSpec& f) {
  Links l;
  l.k = std::max(1, f.nodes);
  l.g = std::max(1, f.ranks_per_node);
  l.n = l.k * l.g;
  l.r = std::max(1, f.rails);
  l.a = f.inter.alpha_s;
  l.b = f.inter.beta_bytes_per_s;
  l.a_intra = f.intra.beta_bytes_per_s > 0 ? f.intra.alpha_s : l.a;
  l.b_intra = f.intra.beta_bytes_per_s > 0 ? f.intra.beta_bytes_per_s : l.b;
  l.o = f.overhead_s;
  const double nic_share = NicShare(l.r, l.g);
  if (l.k == 1) {
    l.a_hop = l.a_intra;
    l.b_hop = l.b_intra;
    l.b_cross = l.b_intra;
  } else if (l.g == 1) {
    // One rank per node: its transfers go over every rail in turn.
    l.a_hop = l.a;
    l.b_hop = l.b * l.r;
    l.b_cross = l.b * l.r;
  } else {
    // A flat algorithm's node-crossing hop is one rank's: its rails (at least one).
    l.a_hop = std::max(l.a_intra, l.a);
    l.b_hop = std::min(l.b_intra, l.b * std::max(1.0, nic_share));
    l.b_cross = std::min(l.b_intra, l.b * nic_share);
  }
  return l;
}

int CeilLog2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

int FloorPow2(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

Estimate Make(const char* name, double steps, double step_s, double bytes, double beta,
              std::string formula) {
  Estimate e;
  e.algorithm = name;
  e.latency_s = steps * step_s;
  e.bandwidth_s = beta > 0 ? bytes / beta : 0;
  e.formula = std::move(formula);
  return e;
}

// Hierarchical: intra phase(s), inter phase among the K ranks of one local index on their rail,
// PRIMER section 3. `intra_phases` is 2 for AllReduce (RS + AG), 1 for RS/AG.
Estimate Hier(const Links& l, double m, int intra_phases, double inter_factor, double inter_steps) {
  const double nic_share = NicShare(l.r, l.g);
  Estimate e;
  e.algorithm = "hier";
  e.latency_s = intra_phases * (l.g - 1) * (l.a_intra + l.o) + inter_steps * (l.a + l.o);
  e.bandwidth_s = intra_phases * (l.g - 1.0) / l.g * m / l.b_intra +
                  inter_factor * (m / l.g) / (l.b * nic_share);
  e.formula =
      absl::StrCat(intra_phases, "(G-1)(a_intra+o) + ", inter_steps, "(a+o) + ", intra_phases,
                   "(G-1)/G M/b_intra + inter M/G / (b s), s = R/G (R < G) or floor(R/G) rails");
  return e;
}

// Recursive halving-doubling over node-major ranks: partners at distance 2^k. When G is a power
// of two the first log2 G rounds (the largest, M/2 + M/4 + ...) stay inside the node and only
// the last carry M/G across nodes, every local rank at once on its rail; otherwise every round
// is costed at the slowest hop. Non-powers of two fold the extra ranks in and out (+2 steps,
// +2 M/b).
Estimate Rhd(const Links& l, double m) {
  const int p = FloorPow2(l.n);
  const bool fold = p != l.n;
  const bool g_pow2 = (l.g & (l.g - 1)) == 0;
  Estimate e;
  e.algorithm = "rhd";
  e.latency_s = (2 * CeilLog2(p) + (fold ? 2 : 0)) * (l.a_hop + l.o);
  if (l.k > 1 && l.g > 1 && g_pow2 && !fold) {
    const double nic_share = NicShare(l.r, l.g);
    e.bandwidth_s = 2 * (1 - 1.0 / l.g) * m / l.b_intra +
                    2 * (1.0 / l.g) * (1 - 1.0 / l.k) * m / (l.b * nic_share);
    e.formula =
        "2 log2(N)(a+o) + 2(1-1/G) M/b_intra + 2(1/G)(1-1/K) M/(b s) (s as hier; first log2 G "
        "rounds inside the node)";
  } else {
    e.bandwidth_s = 2.0 * (p - 1) / p * m / (l.k > 1 ? l.b_cross : l.b_intra);
    if (fold) e.bandwidth_s += 2 * m / l.b_hop;
    e.formula = "2 log2(N)(a+o) + 2(N-1)/N M/b (+ 2 steps and 2M/b folding non-powers of two)";
  }
  return e;
}

// Recursive doubling: log2(p) rounds, each swapping the whole M with a partner; every round is
// costed at the slowest hop and, across nodes, with the node's NICs shared by its ranks.
// Non-powers of two fold as rhd does (+2 steps, +2 M/b).
Estimate Rd(const Links& l, double m) {
  const int p = FloorPow2(l.n);
  const bool fold = p != l.n;
  Estimate e;
  e.algorithm = "rd";
  e.latency_s = (CeilLog2(p) + (fold ? 2 : 0)) * (l.a_hop + l.o);
  e.bandwidth_s = CeilLog2(p) * m / (l.k > 1 ? l.b_cross : l.b_intra);
  if (fold) e.bandwidth_s += 2 * m / l.b_hop;
  e.formula = "log2(N)(a+o) + log2(N) M/b (+ 2 steps and 2M/b folding non-powers of two)";
  return e;
}

}  // namespace

double CriticalSize(const LinkClass& link) { return link.alpha_s * link.beta_bytes_per_s; }

absl::StatusOr<Crossover> RingTreeCrossover(int nranks, const LinkClass& link) {
  if (nranks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("crossover needs --nranks >= 2 (got ", nranks, "): one rank has no ring"));
  }
  const double n = nranks;
  const double lg = std::log2(n);
  const double nstar = CriticalSize(link);
  Crossover c;
  const double denom = lg - (n - 1) / n;
  c.exact_bytes = denom > 0 ? nstar * ((n - 1) - lg) / denom : 0;
  c.log_estimate_bytes = n * nstar / lg;
  c.rough_bytes = n * nstar;
  return c;
}

AllToAllBounds AllToAllLowerBounds(double m, const FabricSpec& fabric) {
  const Links l = Derive(fabric);
  const double n = l.n;
  const double b_inject = l.b_cross;
  AllToAllBounds out;
  out.per_transfer_s = l.a_hop + (m / n) / l.b_hop;
  out.injection_s = l.a_hop + (n - 1) / n * m / b_inject;
  out.ejection_s = out.injection_s;  // uniform routing: every receiver gets as much as it sends
  // One direction of the bisection: N/2 ranks send half their data across, over N/2 links
  // thinned by the oversubscription ratio.
  const double over = std::max(1.0, fabric.oversubscription);
  out.bisection_s = n >= 2 ? l.a_hop + (n * m / 4) / (n * b_inject / (2 * over)) : 0;
  out.lower_bound_s = std::max({out.injection_s, out.ejection_s, out.bisection_s});
  return out;
}

absl::StatusOr<std::vector<Estimate>> ClosedForms(OpKind op, double m, const FabricSpec& fabric) {
  if (IsPointToPoint(op)) {
    return absl::InvalidArgumentError(
        "send/recv is one message: T(n) = alpha + n/beta (see railctl model critical-size)");
  }
  if (!(m >= 0) || !std::isfinite(m)) {
    return absl::InvalidArgumentError(absl::StrCat("size must be >= 0 bytes (got ", m, ")"));
  }
  if (!(fabric.inter.beta_bytes_per_s > 0)) {
    return absl::InvalidArgumentError("the inter-node bandwidth (--beta) must be > 0");
  }
  const Links l = Derive(fabric);
  const double n = l.n;
  const int d = CeilLog2(l.n);
  const double hop = l.a_hop + l.o;
  const bool torus = fabric.kind == FabricKind::kTorus && !fabric.torus_dims.empty();
  const bool hier = l.k > 1 && l.g > 1;
  double torus_steps = 0;  // sum of (d_i - 1)
  for (int dim : fabric.torus_dims) torus_steps += dim - 1;
  std::vector<Estimate> out;
  switch (op) {
    case OpKind::kAllReduce: {
      out.push_back(Make("ring", 2 * (n - 1), hop, 2 * (n - 1) / n * m, l.b_hop,
                         "2(N-1)(a+o) + 2(N-1)/N M/b"));
      out.push_back(
          Make("tree", 2 * d, hop, 2.0 * d * m, l.b_hop, "2 log2(N)(a+o) + 2 log2(N) M/b"));
      out.push_back(Rhd(l, m));
      out.push_back(Rd(l, m));
      out.push_back(Make("dbtree", 2 * d, hop, 2 * m, l.b_hop, "2 log2(N)(a+o) + 2 M/b"));
      if (hier) out.push_back(Hier(l, m, 2, 2.0 * (l.k - 1) / l.k, 2.0 * (l.k - 1)));
      Estimate direct = Make("direct", 2, l.a_hop + (n - 1) * l.o, 2 * (n - 1) / n * m,
                             l.k > 1 ? l.b_cross : l.b_intra,
                             "2(a + (N-1)o) + 2(N-1)/N M/b (all-pairs, ports shared)");
      out.push_back(direct);
      if (torus) {
        out.push_back(Make("torus", 2 * torus_steps, l.a + l.o, 2 * (n - 1) / n * m, l.b,
                           "2 sum(d_i-1)(a+o) + 2(N-1)/N M/b"));
      }
      if (fabric.in_network_reduction) {
        out.push_back(Make("innetwork", 2, l.a + l.o, m, l.b_cross,
                           "2(a+o) + M/b (switches reduce; hosts send M once)"));
      }
      break;
    }
    case OpKind::kReduceScatter:
    case OpKind::kAllGather: {
      out.push_back(Make("ring", n - 1, hop, (n - 1) / n * m, l.b_hop, "(N-1)(a+o) + (N-1)/N M/b"));
      out.push_back(Make("direct", 1, l.a_hop + (n - 1) * l.o, (n - 1) / n * m,
                         l.k > 1 ? l.b_cross : l.b_intra, "(a + (N-1)o) + (N-1)/N M/b"));
      if (hier) {
        Estimate h = Hier(l, m, 1, (l.k - 1.0) / l.k, l.k - 1.0);
        out.push_back(h);
      }
      if (torus) {
        out.push_back(Make("torus", torus_steps, l.a + l.o, (n - 1) / n * m, l.b,
                           "sum(d_i-1)(a+o) + (N-1)/N M/b"));
      }
      break;
    }
    case OpKind::kBroadcast:
    case OpKind::kReduce: {
      out.push_back(Make("ring", n - 1, hop, m, l.b_hop, "(N-1)(a+o) + M/b (pipelined chain)"));
      out.push_back(Make("tree", d, hop, 1.0 * d * m, l.b_hop, "log2(N)(a+o) + log2(N) M/b"));
      out.push_back(Make("dbtree", d, hop, m, l.b_hop, "log2(N)(a+o) + M/b (pipelined tree)"));
      out.push_back(Make("direct", 1, l.a_hop + (n - 1) * l.o, (n - 1) * m, l.b_hop,
                         "(a + (N-1)o) + (N-1) M/b (root's port)"));
      if (hier) {
        const double nic_share = NicShare(l.r, l.g);
        Estimate h;
        h.algorithm = "hier";
        h.latency_s = 2 * (l.a_intra + l.o) + (l.k - 1) * (l.a + l.o);
        h.bandwidth_s = 2 * (l.g - 1.0) / l.g * m / l.b_intra + (m / l.g) / (l.b * nic_share);
        h.formula =
            "2(a_intra+o) + (K-1)(a+o) + 2(G-1)/G M/b_intra + M/G / (b s), s: rails per rank";
        out.push_back(h);
      }
      break;
    }
    case OpKind::kAllToAll:
    case OpKind::kAllToAllv: {
      out.push_back(Make("direct", n - 1, hop, (n - 1) / n * m, l.k > 1 ? l.b_cross : l.b_intra,
                         "(N-1)(a+o) + (N-1)/N M/b (pairwise exchange)"));
      if (hier) {
        const double nic_share = NicShare(l.r, l.g);
        Estimate h;
        h.algorithm = "hier";
        h.latency_s = 2 * (l.a_intra + l.o) + (l.k - 1) * (l.a + l.o);
        h.bandwidth_s =
            2 * (l.g - 1.0) / l.g * m / l.b_intra + (l.k - 1.0) / l.k * m / (l.b * nic_share);
        h.formula =
            "2(a_intra+o) + (K-1)(a+o) + 2(G-1)/G M/b_intra + (K-1)/K M / (b s), s: rails per rank";
        out.push_back(h);
      }
      break;
    }
    case OpKind::kBarrier: {
      out.push_back(Make("ring", 2 * (n - 1), hop, 0, 0, "2(N-1)(a+o)"));
      out.push_back(Make("tree", 2 * d, hop, 0, 0, "2 log2(N)(a+o)"));
      out.push_back(Make("rhd", d, hop, 0, 0, "log2(N)(a+o) (dissemination)"));
      out.push_back(Make("direct", 1, l.a_hop + (n - 1) * l.o, 0, 0, "a + (N-1)o"));
      break;
    }
    case OpKind::kSend:
    case OpKind::kRecv:
      break;
  }
  return out;
}

}  // namespace railyard::scheduler::cost
