#include "cleave/parallel/step_executor.h"

#include <chrono>
#include <cstring>
#include <string>

namespace cleave {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

BackwardPart part_of(Op op) {
  return op == Op::backward_input    ? BackwardPart::input
         : op == Op::backward_weight ? BackwardPart::weight
                                     : BackwardPart::both;
}

}  // namespace

UnitLayout unit_layout(const Transformer& model) {
  UnitLayout l;
  for (int c = 0; c < int(model.chunks().size()); ++c) l.chunk_units.push_back(model.chunk_units(c));
  for (const Transformer::Unit& u : model.units()) {
    l.uses.push_back(u.uses);
    l.has_weight_part.push_back(u.kind == Transformer::UnitKind::block);
  }
  if (model.pipeline_tied_tensor() >= 0)
    l.tied_units.push_back(model.params().tensor(model.pipeline_tied_tensor()).unit);
  return l;
}

StepTimes StepExecutor::run(const Program& program, const StepRun& run) {
  const int64_t B = run.B, T = run.T;
  Transformer& model = *parts_.model;
  model.prepare(B, T, program.slots);
  const int chunks = int(program.slots.size());
  batches_.resize(size_t(chunks));
  for (int c = 0; c < chunks; ++c) batches_[size_t(c)].resize(size_t(program.slots[size_t(c)]));
  const int64_t floats = model.stream_floats();
  // Transfers in flight per chunk and slot: receives waited for by the compute that consumes
  // them, sends before the buffer they read is written again.
  struct InFlight {
    Work recv_forward, recv_backward, send_forward, send_backward;
  };
  std::vector<std::vector<InFlight>> flight(static_cast<size_t>(chunks));
  for (int c = 0; c < chunks; ++c) flight[size_t(c)].resize(size_t(program.slots[size_t(c)]));
  StepTimes out;
  auto wait = [&](Work& w) {
    if (!w.valid()) return;
    out.comm[CommAxis::pp].exposed_s += w.wait();
    w = Work();
  };
  const double t0 = now();
  out.started = t0;
  double span_start = 0, span_end = 0;
  const Instruction* span = nullptr;  // the schedule action being traced
  auto close_span = [&](double at) {
    if (!span) return;
    out.trace.push_back({parts_.rank, action_name(*span), 1e6 * (span_start - t0),
                         1e6 * (at - span_start), -1, ""});
    span = nullptr;
  };

  for (const Instruction& i : program.instructions) {
    // A compute instruction's time starts once the transfers it consumes have arrived.
    double start = now();
    switch (i.op) {
      case Op::forward: {
        const std::vector<int>& units = model.chunk_units(i.chunk);
        InFlight& f = flight[size_t(i.chunk)][size_t(i.slot)];
        if (i.unit == units.front()) {
          wait(f.recv_forward);
          wait(f.send_forward);  // the chunk's output is about to be written again
          start = now();
          run.fill(i.mb, batches_[size_t(i.chunk)][size_t(i.slot)]);
        }
        const Batch& batch = batches_[size_t(i.chunk)][size_t(i.slot)];
        model.forward_unit(i.unit, i.slot, batch, run.grad_scale);
        if (model.units()[size_t(i.unit)].kind == Transformer::UnitKind::head) {
          const float* losses = model.losses(i.slot);
          for (int64_t k = 0; k < B * T; ++k) out.loss_sum += losses[k];
          out.loss_tokens += batch.valid_tokens;
        }
        break;
      }
      case Op::backward:
      case Op::backward_input:
      case Op::backward_weight: {
        const std::vector<int>& units = model.chunk_units(i.chunk);
        InFlight& f = flight[size_t(i.chunk)][size_t(i.slot)];
        if (i.op != Op::backward_weight && i.unit == units.back()) {
          wait(f.recv_backward);
          wait(f.send_backward);  // the gradient of the chunk's input is about to be written
          start = now();
        }
        model.backward_unit(i.unit, i.slot, part_of(i.op));
        break;
      }
      case Op::drop_activations:
        model.release_saved(i.unit, i.slot);
        break;
      case Op::recompute: {
        // The chunk's last block writes the chunk's output again: bitwise the same values, but
        // not under a send still reading them.
        if (i.unit == model.chunk_units(i.chunk).back())
          wait(flight[size_t(i.chunk)][size_t(i.slot)].send_forward);
        model.recompute(i.unit, i.slot);
        break;
      }
      case Op::send_forward:
      case Op::send_backward: {
        const bool fwd = i.op == Op::send_forward;
        InFlight& f = flight[size_t(i.chunk)][size_t(i.slot)];
        (fwd ? f.send_forward : f.send_backward) = parts_.pp->send(
            fwd ? model.chunk_output(i.chunk, i.slot) : model.chunk_input_grad(i.chunk, i.slot),
            floats, CommType::f32, i.peer, i.tag);
        out.comm[CommAxis::pp].bytes += floats * int64_t(sizeof(float));
        break;
      }
      case Op::recv_forward:
      case Op::recv_backward: {
        const bool fwd = i.op == Op::recv_forward;
        Work& w = fwd ? flight[size_t(i.chunk)][size_t(i.slot)].recv_forward
                      : flight[size_t(i.chunk)][size_t(i.slot)].recv_backward;
        wait(w);
        w = parts_.pp->recv(
            fwd ? model.chunk_input(i.chunk, i.slot) : model.chunk_output_grad(i.chunk, i.slot),
            floats, CommType::f32, i.peer, i.tag);
        break;
      }
      case Op::copy_forward:
        std::memcpy(model.chunk_input(i.chunk, i.slot), model.chunk_output(i.from_chunk, i.from_slot),
                    size_t(floats) * sizeof(float));
        break;
      case Op::copy_backward:
        std::memcpy(model.chunk_output_grad(i.chunk, i.slot),
                    model.chunk_input_grad(i.from_chunk, i.from_slot), size_t(floats) * sizeof(float));
        break;
      case Op::gather:
        for (DataParallel* dp : parts_.dp) dp->gather(i.unit);
        break;
      case Op::prefetch:
        for (DataParallel* dp : parts_.dp) dp->prefetch(i.unit);
        break;
      case Op::release:
        for (DataParallel* dp : parts_.dp) dp->release(i.unit);
        break;
      case Op::tied_sum: {
        // GPT-2's tied embedding: the first stage's lookup gradient plus the last stage's head
        // gradient, on both (Megatron's embedding group), in a fixed order.
        ParamStore& params = model.params();
        const int t = model.pipeline_tied_tensor();
        const int64_t n = params.tensor(t).numel;
        AxisTraffic& pp = out.comm[CommAxis::pp];
        pp.exposed_s +=
            parts_.tied->all_reduce(params.grad(t), n, CommType::f32, CommAlgo::ours).wait();
        pp.bytes += ring_all_reduce_bytes(n * int64_t(sizeof(float)), parts_.tied->size());
        break;
      }
      case Op::reduce_grads: {
        if (parts_.before_reduce) parts_.before_reduce(i.unit);
        // Pending sums over tp ranks complete before the unit's data-parallel reduction.
        const ParamStore& params = model.params();
        if (parts_.tp_grads)
          for (int g = 0; g < params.n_groups(); ++g)
            parts_.tp_grads->reduce_partial(params.unit_bounds(g)[size_t(i.unit)],
                                            params.unit_bounds(g)[size_t(i.unit) + 1]);
        for (DataParallel* dp : parts_.dp) dp->reduce_gradients(i.unit);
        break;
      }
      case Op::finish_grads:
        parts_.end->begin(run.step);
        parts_.end->finish_gradients();
        break;
      case Op::sum_loss:
        parts_.end->sum_loss(out.loss_sum, double(out.loss_tokens), run.loss_tokens);
        break;
      case Op::grad_norm:
        parts_.end->grad_norm();
        break;
      case Op::clip:
        parts_.end->clip();
        break;
      case Op::update:
        parts_.end->update(i.group, run.lr);
        break;
      case Op::gather_params:
        parts_.end->gather_parameters(i.group);
        break;
      case Op::moe_stats:
        parts_.end->moe_stats();
        break;
      case Op::fp8_scales:
        parts_.end->fp8_scales();
        break;
    }
    if (is_step_end(i.op)) {
      out.end = parts_.end->result();
      if (run.trace) {
        close_span(span_end);
        const double end = now();
        std::string name = op_name(i.op);
        if (i.group >= 0) name.append(" ").append(std::to_string(i.group));
        out.trace.push_back({parts_.rank, name, 1e6 * (start - t0), 1e6 * (end - start), -1, ""});
      }
    }
    if (is_compute(i.op)) {
      const double end = now();
      out.busy_seconds += end - start;
      if (run.trace) {
        // One span per schedule action: its units, and what ran between them (ZeRO-3 gathers).
        if (span && !same_action(i, *span))
          close_span(span_end);
        if (!span) {
          span = &i;
          span_start = start;
        }
        span_end = end;
      }
    }
    if (parts_.after_instruction) parts_.after_instruction();
  }
  close_span(span_end);
  for (auto& per_chunk : flight)
    for (InFlight& f : per_chunk) {
      wait(f.send_forward);
      wait(f.send_backward);
      CLEAVE_CHECK(!f.recv_forward.valid() && !f.recv_backward.valid(),
                   "a receive of the step program was never consumed");
    }
  out.seconds = now() - t0;
  return out;
}

}  // namespace cleave
