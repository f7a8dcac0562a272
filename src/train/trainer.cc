#include "shardtrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/checkpoint_saver.h"
#include "shardtrain/ckpt/dir_lock.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/node_local.h"
#include "shardtrain/ckpt/peft_adapter.h"
#include "shardtrain/ckpt/replica_resume.h"
#include "shardtrain/ckpt/resume_data.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/comm/watchdog.h"
#include "shardtrain/comm/watched_communicator.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/core/format.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/core/preempt.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/data/data_split.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/data/text_codec.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/text/tokenizer_codec.h"
#include "shardtrain/train/metrics.h"
#include "shardtrain/train/mfu.h"
#include "shardtrain/train/step_engine.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/model/cuda_decoder.h"
#endif

namespace st {
namespace {

// Every rank must train the same config (a hostfile run with one box's config file edited, or a flag given to one
// rank, would otherwise train something no checkpoint can describe). Rank 0's INI goes to every rank; a rank
// whose own differs names the first differing key, and every rank stops with kBadInput before step 1.
void check_same_config(const Config& cfg, Communicator& comm) {
  const std::string mine = to_ini(cfg);
  int64_t size = static_cast<int64_t>(mine.size());
  comm.broadcast(&size, sizeof(size), 0);
  std::string lead = comm.rank() == 0 ? mine : std::string(static_cast<size_t>(size), '\0');
  comm.broadcast(lead.data(), size, 0);
  std::string differs;
  if (lead != mine) {
    std::istringstream a(lead), b(mine);
    std::string la, lb, section;
    while (std::getline(a, la)) {
      if (!std::getline(b, lb)) lb.clear();
      if (!la.empty() && la[0] == '[') section = la.substr(1, la.size() - 2);
      if (la != lb) {
        const std::string key = la.substr(0, la.find(" ="));
        differs = str_cat(section, ".", key, ": rank 0 has '", la, "', rank ", comm.rank(), " has '", lb, "'");
        break;
      }
    }
    if (differs.empty()) differs = str_cat("rank ", comm.rank(), "'s config has more lines than rank 0's");
  }
  double bad = differs.empty() ? 0.0 : 1.0;
  comm.all_reduce(&bad, 1);
  if (!differs.empty()) ST_BAD_INPUT("the ranks were given different configs; first difference: ", differs);
  if (bad > 0)
    ST_BAD_INPUT("the ranks were given different configs (", bad,
                 " rank(s) differ from rank 0; their errors name the key)");
}

// Every rank's peak memory, in rank order, on every rank: one all-reduce of world doubles (exact for any byte
// count below 2^53) a step, next to the step's own collectives.
std::vector<int64_t> peak_memory_per_rank(int64_t mine, Communicator& comm) {
  std::vector<double> all(static_cast<size_t>(comm.world_size()), 0.0);
  all[static_cast<size_t>(comm.rank())] = static_cast<double>(mine);
  comm.all_reduce(all.data(), static_cast<int64_t>(all.size()));
  std::vector<int64_t> bytes;
  for (double b : all) bytes.push_back(std::llround(b));
  return bytes;
}

// Why the end-of-run sample's decoder does not fit beside the training state (memory_plan.h: sample_misfit), as this
// rank finds it, or which rank lacks the memory; "" when it fits on every rank. Collective: every rank decides alike.
std::string sample_misfit_on_ranks(const Config& cfg, Communicator& comm) {
  int64_t device_free = std::numeric_limits<int64_t>::max();
#ifdef SHARDTRAIN_HAVE_CUDA
  if (cfg.train.device == Device::kCuda) device_free = cuda_device_free_bytes(comm.device_rank());
#endif
  const std::string mine = sample_misfit(
      cfg, device_free, host_memory_budget(host_memory_limits(), comm.device_ranks(), cfg.dist.max_host_mem_gib));
  std::vector<double> misfit(static_cast<size_t>(comm.world_size()), 0.0);
  misfit[static_cast<size_t>(comm.rank())] = mine.empty() ? 0.0 : 1.0;
  comm.all_reduce(misfit.data(), static_cast<int64_t>(misfit.size()));
  for (int r = 0; r < comm.world_size(); ++r)
    if (misfit[static_cast<size_t>(r)] > 0) return r == comm.rank() ? mine : str_cat("on rank ", r, " it does not fit");
  return "";
}

}  // namespace

TrainSummary run_training(const Config& cfg, Communicator& world_comm) {
  // Every collective below, NCCL's included, runs under dist.timeout_s's deadline.
  Watchdog watchdog(cfg.dist.timeout_s, world_comm.rank());
  WatchedCommunicator comm(world_comm, watchdog, "world");
  const int rank = comm.rank(), world = comm.world_size();
  const bool lead = rank == 0;
  check_same_config(cfg, comm);
  // This job owns ckpt.dir from here to its exit: a second job on it, or a ckpt.dir that is a file or
  // read-only, stops every rank with kBadInput before anything is loaded, cleaned or trained. With
  // ckpt.replicas = 1 each node owns its own directory (node_local.h).
  const bool node_local = cfg.ckpt.replicas == 1;
  const DirLock ckpt_dir_lock =
      node_local ? lock_node_local_dirs(cfg.ckpt.dir, comm) : lock_checkpoint_dir(cfg.ckpt.dir, comm);
  const int64_t accum = cfg.grad_accum_steps(world);
  const int64_t B = cfg.train.micro_batch, T = cfg.model.seq_len;

  // Everything that can be wrong with the inputs is found here, before step 1 (every rank opens and
  // validates the same files, so every rank fails alike).
  // An init.from directory's config.json made the model: its own weights must agree with it (their vocabulary, every
  // tensor and nothing more) before the data is judged against that vocab_size.
  if (!cfg.init.from.empty()) check_init_from(cfg.init.from, cfg.model);
  DataSplit data = open_data(cfg.data, cfg.model.vocab_size, cfg.model.seq_len);
  if (lead) ST_LOG_INFO("data: train ", data.train->describe());
  if (lead) ST_LOG_INFO("data: val ", data.val->describe());
  // The end-of-run sample's text: through data.tokenizer (loaded now, so that a wrong file stops the run before step
  // 1), or bytes for a byte-level text run.
  const bool byte_level = cfg.data.format == DataFormat::kText && cfg.model.vocab_size == 256;
  const std::unique_ptr<TextCodec> codec =
      !cfg.data.tokenizer.empty() || byte_level
          ? make_text_codec(cfg.data.tokenizer, cfg.model.vocab_size, "data.tokenizer")
          : nullptr;
  SamplerOptions so;
  so.T = static_cast<int>(T);
  so.micro_batch = B;
  so.rank = rank;
  so.world = world;
  so.accum = accum;
  so.seed = cfg.train.seed;
  so.shuffle = cfg.data.shuffle;
  const Sampler train_sampler(*data.train, so);
  const Sampler val_sampler(*data.val, so);
  // Loss masks that leave the validation batches without a target would fail the first evaluation: found here.
  if (val_sampler.eval_targets(cfg.train.eval_batches) == 0) {
    ST_BAD_INPUT("validation data ", data.val->describe(), ": its loss masks mark no target in the ",
                 cfg.train.eval_batches,
                 " validation batch(es) of train.eval_batches (every one is masked); use other validation data, more "
                 "train.eval_batches, or data.loss_mask=off");
  }

  StepEngine engine(cfg, comm);
  const int64_t n_params = count_params(engine.units());
  const double step_flops_per_token = flops_per_token(cfg.model);
  const MemoryStats mem0 = engine.sharded().memory();
  if (lead) {
    ST_LOG_INFO("model: ", to_string(cfg.model.arch), ", ", cfg.model.n_layer, " layers, ", cfg.model.n_head, " heads",
                cfg.model.kv_heads() != cfg.model.n_head ? str_cat(" (", cfg.model.kv_heads(), " K/V heads)") : "",
                ", n_embd ", cfg.model.n_embd, cfg.model.is_llama() ? str_cat(", ffn_dim ", cfg.model.ffn_dim) : "",
                ", vocab ", cfg.model.vocab_size, " (padded ", cfg.model.padded_vocab(), "), seq_len ", T, ", ",
                n_params, " parameters in ", engine.units().size(), " units");
    ST_LOG_INFO("batch: global ", cfg.train.global_batch, " = micro ", B, " x world ", world, " x accum ", accum, " (",
                cfg.train.global_batch * T, " tokens per step)",
                !cfg.train.recompute             ? ""
                : cfg.train.recompute_blocks > 0 ? str_cat(", recompute on (the first ", cfg.train.recompute_blocks,
                                                           " of ", cfg.model.n_layer, " blocks)")
                                                 : ", recompute on");
    ST_LOG_INFO("backend: ", engine.sharded().describe());
    ST_LOG_INFO("sharding: ", comm.kind(), " communicator, ", world, " rank(s); per rank: sharded state ",
                format_mib(mem0.sharded_state_bytes), " (", mem0.padding_elements,
                " elements of padding), gather buffers ", format_mib(mem0.gather_buffer_bytes));
    if (cfg.train.device == Device::kCuda)
      ST_LOG_INFO("device memory per rank: activations ", format_mib(mem0.activation_bytes), ", workspace ",
                  format_mib(mem0.workspace_bytes), "; in use on the device after set-up ",
                  format_mib(mem0.device_in_use_bytes));
  }

  // ckpt.export is written at the end, by the lead rank, into a new file: a directory it cannot be written into, or a
  // file already there, is bad input found before step 1.
  if (!cfg.ckpt.export_path.empty()) {
    check_output_dir(cfg.ckpt.export_path, "ckpt.export");
    // Every rank exits alike (the lead's error), rather than the others waiting for a lead that gave up.
    const auto refuse = [&] {
      if (lead) refuse_existing(cfg.ckpt.export_path, "ckpt.export");
    };
    on_all_ranks(comm, refuse, "refused ckpt.export");
  }
  // Resume before anything is written: a bad checkpoint is bad input, found before step 1.
  TrainSummary summary;
  int64_t start_step = 0;
  std::string resumed_from;
  if (!cfg.ckpt.dir.empty()) {
    if (lead)
      ST_LOG_INFO("checkpoints: ", cfg.ckpt.dir, " every ", cfg.ckpt.every, " step(s), keep ", cfg.ckpt.keep,
                  node_local ? "; node-local directories, each node's files replicated on the previous node" : "",
                  "; HDF5 file locking ", hdf5_file_locking_mode());
    if (node_local ? comm.local_rank() == 0 : lead) clean_uncommitted(node_ckpt_dir(cfg.ckpt.dir, comm.node_id()));
    comm.barrier();
  }
  // A LoRA run's frozen base, as its checkpoints name it (the lead hashes the files once; only the lead writes
  // manifests): what a resume read, else described below.
  const bool lora = cfg.model.lora.enabled();
  ManifestBase base;
  const std::optional<std::string> resume_from =
      node_local ? resume_node_local(cfg, engine.sharded(), comm) : resolve_resume(cfg.ckpt);
  if (const std::optional<std::string>& from = resume_from) {
    const CheckpointState cs = load_checkpoint(*from, cfg, engine.sharded(), comm);
    const DataOrder order{cfg.train.global_batch, cfg.train.seed, cfg.data.shuffle, train_sampler.num_windows()};
    const std::vector<std::string> notes = check_data_order(cs.data, cs.step, order, cfg.ckpt.allow_data_change, *from);
    if (lead)
      for (const std::string& line : notes) ST_LOG_INFO(line);
    engine.set_updates(cs.optimizer_updates);
    engine.loss_scaler().restore(cs.loss_scale, cs.loss_scale_good_steps);
    start_step = cs.step;
    summary.skipped = cs.skipped_steps;
    resumed_from = *from;
    base = cs.base;
    if (lead && !lora && !cfg.init.from.empty())
      ST_LOG_INFO("init.from ", cfg.init.from, " not used: the run resumes from ", *from);
  } else if (cfg.ckpt.resume == "auto" && !cfg.ckpt.dir.empty() && lead && !node_local) {
    ST_LOG_INFO("ckpt.resume=auto: no committed checkpoint in ", cfg.ckpt.dir, ": starting fresh");
  }
  if (lora && !cfg.ckpt.dir.empty() && resumed_from.empty())
    on_all_ranks(
        comm,
        [&] {
          if (lead) base = describe_lora_base(cfg.init.from);
        },
        "could not read the LoRA base");
  // (A LoRA checkpoint's load read the base from init.from already: the checkpoint holds the adapters only.)
  if (resumed_from.empty() && !cfg.init.from.empty()) {
    init_from_weights(cfg.init.from, cfg.model, engine.sharded());
    if (lead) ST_LOG_INFO("init.from: weights loaded from ", cfg.init.from);
  }
  if (resumed_from.empty() && !cfg.model.lora.from.empty()) {
    load_peft_adapter(cfg.model.lora.from, cfg.model, engine.sharded());
    if (lead) ST_LOG_INFO("lora.from: adapters loaded from ", cfg.model.lora.from);
  }
  // Saves run in the background (ckpt.async): their agreement rides on the per-step all-reduce below.
  std::unique_ptr<CheckpointSaver> saver;
  if (!cfg.ckpt.dir.empty()) saver = std::make_unique<CheckpointSaver>(cfg, engine.sharded(), comm, resumed_from);
  auto save = [&](int64_t steps_done) {
    if (!saver) return;
    CheckpointState cs;
    cs.step = steps_done;
    cs.optimizer_updates = engine.updates();
    cs.skipped_steps = summary.skipped;
    cs.loss_scale = engine.loss_scaler().scale();
    cs.loss_scale_good_steps = engine.loss_scaler().good_steps();
    cs.data.train_windows = train_sampler.num_windows();
    cs.base = base;
    saver->save(cs);
  };
  auto drain = [&] {
    if (saver) saver->drain();
  };

  MetricsSink sink(cfg.log.metrics, cfg.train.steps, cfg.log.every, lead, /*append=*/start_step > 0);
  auto evaluate = [&](int64_t step) {
    const float v = engine.evaluate([&](int64_t i, int32_t* in, int32_t* tgt) { val_sampler.fill_eval(i, in, tgt); },
                                    cfg.train.eval_batches);
    sink.eval(step, v);
    return v;
  };

  std::vector<double> rates;
  // A checkpoint at or past train.steps: the run is finished. No step, evaluation, save or sample; ckpt.export
  // is still written (the weights are the finished run's).
  summary.nothing_to_train = start_step >= cfg.train.steps;
  if (summary.nothing_to_train && lead)
    ST_LOG_INFO("nothing to train: the checkpoint ", resumed_from, " is at step ", start_step, ", train.steps is ",
                cfg.train.steps, " (raise train.steps to train further)");
  summary.steps = start_step;
  int64_t skipped_here = 0, no_targets_here = 0;  // this invocation's skipped steps (summary.skipped spans resumes)
  StepStats last_stats;
  for (int64_t step = start_step; step < cfg.train.steps; ++step) {
    engine.sharded().take_exposed_comm_ms();  // drop what evaluation or set-up waited
    const int64_t cross_before = engine.sharded().counters().cross_node_bytes;
    if (fault_injected("sigstop", rank, step + 1)) std::raise(SIGSTOP);  // a stopped rank: the watchdog's test
    const auto t0 = std::chrono::steady_clock::now();
    const StepStats stats =
        engine.train_step([&](int64_t micro, int32_t* in, int32_t* tgt) { train_sampler.fill(step, micro, in, tgt); },
                          accum, step, train_sampler.step_targets(step));
    const double sec = seconds_since(t0);

    StepReport r;
    r.step = step + 1;
    r.stats = stats;
    r.ms = sec * 1e3;
    r.comm_exposed_ms = engine.sharded().take_exposed_comm_ms();
    r.comm_cross_node_bytes = engine.sharded().counters().cross_node_bytes - cross_before;
    // A step with no target computed nothing: no throughput to report.
    r.tokens_per_s = stats.no_targets ? 0.0 : static_cast<double>(cfg.train.global_batch * T) / sec;
    const MemoryStats mem = engine.sharded().memory();
    r.mem_sharded_bytes = mem.sharded_state_bytes;
    r.mem_gathered_peak_bytes = mem.gathered_peak_bytes;
    r.mem_peak_bytes = peak_memory_per_rank(engine.sharded().peak_memory_bytes(), comm);
    r.on_gpu = cfg.train.device == Device::kCuda;
    r.mfu = mfu(step_flops_per_token, r.tokens_per_s, world, engine.sharded().device_name());
    if (!stats.no_targets) rates.push_back(r.tokens_per_s);
    last_stats = stats;
    if (stats.skipped) ++skipped_here;
    if (stats.no_targets) ++no_targets_here;
    if (stats.no_targets) {
      ++summary.skipped;
      if (lead)
        ST_LOG_WARN("step ", step + 1, ": the loss masks mark no target in the step's ", cfg.train.global_batch,
                    " sequences; nothing to learn from, update skipped on every rank");
    } else if (stats.skipped) {
      ++summary.skipped;
      if (lead)
        ST_LOG_WARN("step ", step + 1, ": non-finite loss (", stats.loss, ") or gradient norm (", stats.grad_norm,
                    "); update skipped on every rank",
                    engine.loss_scaler().active()
                        ? str_cat("; fp16 loss scale ", stats.loss_scale, " -> ", engine.loss_scaler().scale())
                        : std::string());
    }
    r.skipped_total = summary.skipped;
    const bool last = step + 1 == cfg.train.steps;
    const bool saved = last || (cfg.ckpt.every > 0 && (step + 1) % cfg.ckpt.every == 0);
    if (saved) {
      const auto s0 = std::chrono::steady_clock::now();
      save(step + 1);
      r.ckpt_ms = seconds_since(s0) * 1e3;
      r.ckpt_wait_ms = saver ? saver->last_wait_ms() : 0.0;
    }
    // One all-reduce a step: a stop signal on any rank, and the pending save's agreement (checkpoint_saver.h).
    std::vector<double> control(1 + (saver ? saver->control_words() : 0), 0.0);
    if (fault_injected("sigterm", rank, step + 1)) std::raise(SIGTERM);  // a stop signal with a save pending
    control[0] = preemption_requested() ? 1.0 : 0.0;
    if (saver) saver->put_control(control.data() + 1);
    comm.all_reduce(control.data(), static_cast<int64_t>(control.size()));
    if (saver) saver->take_control(control.data() + 1);
    const double stop = control[0];
    sink.step(r);
    if (step == start_step) engine.sharded().reset_op_profile();  // keep the first step's one-time costs out
    summary.steps = step + 1;
    summary.last_loss = stats.loss;
    if (last || (cfg.train.eval_every > 0 && (step + 1) % cfg.train.eval_every == 0)) {
      summary.val_loss = evaluate(step + 1);
    }
    // Preemption: one signalled rank stops them all here, after a committed checkpoint: the pending save commits
    // first, then this step's.
    if (stop > 0 && !last) {
      drain();
      if (!saved) save(step + 1);
      drain();
      summary.preempted = true;
      summary.checkpoint = cfg.ckpt.dir.empty()
                               ? std::string()
                               : node_ckpt_dir(cfg.ckpt.dir, comm.node_id()) + "/" + step_dir_name(step + 1);
      // Exit 76 either way (README "Exit codes"): the signal stopped the run, not its input or a fault.
      if (lead)
        ST_LOG_WARN("preempted (a stop signal on ", stop, " rank(s)) after step ", step + 1,
                    cfg.ckpt.dir.empty()
                        ? str_cat(": NO checkpoint was saved (ckpt.dir is not set), so the ", step + 1,
                                  " step(s) trained are lost and a rerun starts again from step 1; exit 76 "
                                  "here does not mean a checkpoint was committed")
                        : ": checkpoint " + summary.checkpoint + " committed; resume with ckpt.resume=auto");
      break;
    }
  }
  drain();  // a normal end waits for the last save's commit
  summary.median_tokens_per_s = median(rates);
  if (summary.preempted) return summary;  // no export, no sample: the run is not finished
  // A run that applied no update trained nothing: not a success (README "Exit codes": bad input, as the weights, the
  // data or the settings make every step non-finite, and a retry repeats it). Every rank sees the same skips (the
  // norm and the loss are all-reduced), so every rank refuses alike. The checkpoints it saved stay; resuming from one
  // finds the same (below, and the nothing-to-train case).
  const int64_t ran = summary.steps - start_step;
  if (ran > 0 && skipped_here == ran) {
    const int64_t non_finite = ran - no_targets_here;
    ST_BAD_INPUT(
        "every one of the ", ran,
        " step(s) this run took was skipped, so no update was applied and the weights are "
        "those it started from: ",
        non_finite > 0
            ? str_cat(non_finite, " for a non-finite loss or gradient norm (the last: loss ", last_stats.loss,
                      ", grad_norm ", last_stats.grad_norm,
                      engine.loss_scaler().active() ? str_cat(", fp16 loss scale now ", engine.loss_scaler().scale())
                                                    : std::string(),
                      ")")
            : std::string(),
        non_finite > 0 && no_targets_here > 0 ? ", " : "",
        no_targets_here > 0 ? str_cat(no_targets_here, " because the loss masks mark no target in the step's batch")
                            : std::string(),
        ". Check the starting weights", cfg.init.from.empty() ? std::string() : " (init.from " + cfg.init.from + ")",
        ", the data and optim.lr; a rerun repeats this",
        saver ? str_cat(" (the checkpoints saved hold the starting weights, in ", cfg.ckpt.dir, ")") : std::string());
  }
  if (summary.nothing_to_train && start_step > 0 && summary.skipped == start_step)
    ST_BAD_INPUT("nothing to train: the checkpoint ", resumed_from, " is at step ", start_step, ", but all ",
                 start_step,
                 " of its steps were skipped (non-finite loss or gradient, or no target), so it holds the "
                 "starting weights, untrained; the run that wrote it failed. Start again without it, after fixing the "
                 "weights, the data or optim.lr");
  const std::string profile =
      summary.nothing_to_train ? std::string() : engine.sharded().op_profile(summary.steps - start_step - 1);
  if (lead && !profile.empty()) sink.line(profile);
  if (lead && !summary.nothing_to_train) {
    const MemoryStats mem = engine.sharded().memory();
    ST_LOG_INFO(
        "memory per rank: sharded state ", format_mib(mem.sharded_state_bytes), ", gathered buffers peak ",
        format_mib(mem.gathered_peak_bytes),
        cfg.train.device == Device::kCuda ? ", device in use " + format_mib(mem.device_in_use_bytes) : std::string());
  }

  if (!cfg.ckpt.export_path.empty()) {
    // A LoRA model exports as its base with the adapters merged in. Every rank gathers each unit in turn (collective),
    // and the lead writes it (merged) before the next: one unit's buffers on the host at a time. Each step agrees
    // across the ranks, so that a failed write stops every rank alike.
    const ModelConfig merged = base_model(cfg.model);
    const std::vector<UnitLayout> base_units = build_units(merged);
    const char* what = "could not write ckpt.export";
    std::unique_ptr<HfWeightsWriter> writer;
    on_all_ranks(
        comm,
        [&] {
          if (lead) writer = std::make_unique<HfWeightsWriter>(cfg.ckpt.export_path, merged, base_units);
        },
        what);
    for (const UnitLayout& u : engine.units()) {
      std::vector<float> w = engine.gather_unit(u.index);
      on_all_ranks(
          comm,
          [&] {
            if (!lead) return;
            if (cfg.model.lora.enabled())
              w = merge_lora_unit(cfg.model, u, base_units[static_cast<size_t>(u.index)], w);
            writer->write_unit(u.index, w.data());
          },
          what);
    }
    on_all_ranks(
        comm,
        [&] {
          if (lead) writer->commit();
        },
        what);
    if (lead) ST_LOG_INFO("ckpt.export: wrote the final weights to ", cfg.ckpt.export_path);
  }

  // The sample's decoder comes beside the training state, which stays allocated: a run whose memory leaves no room for
  // it ends without the sample (the checkpoint decodes on its own: shardtrain generate --ckpt).
  const std::string misfit =
      codec && cfg.train.sample_tokens > 0 && !summary.nothing_to_train ? sample_misfit_on_ranks(cfg, comm) : "";
  if (lead && !misfit.empty())
    ST_LOG_INFO("sample: skipped, ", misfit, "; decode a checkpoint of this run with shardtrain generate --ckpt DIR");
  if (codec && cfg.train.sample_tokens > 0 && !summary.nothing_to_train && misfit.empty()) {
    std::vector<int32_t> prompt(static_cast<size_t>(std::min<int64_t>(16, data.val->size())));
    data.val->read(0, static_cast<int64_t>(prompt.size()), prompt.data());
    SamplingOptions sampling;  // temperature 1 over the whole vocabulary
    sampling.seed = cfg.train.seed;
    const std::vector<int32_t> gen = engine.generate(prompt, cfg.train.sample_tokens, sampling);
    summary.sample = codec->decode(prompt) + codec->decode(gen);
    sink.line("sample (prompt: the first " + std::to_string(prompt.size()) + (byte_level ? " bytes" : " tokens") +
              " of the validation data):\n" + summary.sample);
  }
  return summary;
}

}  // namespace st
