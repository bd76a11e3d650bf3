"""Names of every MLflow metric, tag and artifact the pipeline writes.

One place for them so the job that logs and the analysis that reads agree. Keys are
namespaced and MLflow-safe (no parentheses, no spaces). Units are in the names.
"""

from __future__ import annotations

from collections.abc import Mapping

EXPERIMENT = "slurm-qualify"  # the MLflow experiment's default name (tracking.experiment)

# --- tags -------------------------------------------------------------------------------
TAG_SWEEP_ID = "sq.sweep_id"
TAG_POINT_ID = "sq.point_id"
TAG_CANDIDATE = "sq.candidate"  # the candidate's name, one report row: pipeline/config/resolved.py Candidate
TAG_PARTITION = "sq.partition"
TAG_GPU_TYPE = "sq.gpu_type"
TAG_MODEL = "sq.model"
TAG_PRECISION = "sq.precision"
TAG_PARALLELISM = "sq.parallelism"
TAG_DRILLS = "sq.drills"  # comma-separated enabled drills, "none" if none
TAG_OUTCOME = "sq.outcome"  # accepted | failed | error | running | submitted
TAG_REASON = "sq.reason"  # why it failed (oom, unsupported_precision, crash, ...), "" if accepted
TAG_REASON_DETAIL = "sq.reason_detail"  # one line of human text
TAG_MODEL_FAMILY = "sq.model_family"  # transformers model_type of the model as built
TAG_MODEL_FOLDER = "sq.model_folder"  # model.pretrained's folder (a snapshot for a hub name)
TAG_MODEL_CONFIG_SHA256 = "sq.model_config_sha256"  # sha256 of that folder's config.json
TAG_METHOD = "sq.method"  # full | lora | qlora (the method axis of the report)
TAG_HOST = "sq.host"
TAG_GIT_SHA = "sq.git_sha"
TAG_VERSIONS = "sq.versions"  # "torch=2.x deepspeed=0.x ..."
TAG_DEVICE = "sq.device"  # cpu | cuda:<name>
TAG_LAUNCHER = "sq.launcher"  # local | slurm
TAG_PROBES = "sq.probes"  # measured | reused from attempt <k> (<age> s old, the same nodes)
# the cluster the sweep ran on (pipeline.slurm.cluster.ClusterIdentity), on the parent and every point
TAG_CLUSTER = "sq.cluster"  # Slurm's ClusterName; local-<hostname> for the local launcher
TAG_CLUSTER_CONTROLLER = "sq.cluster_controller"  # SlurmctldHost[0]'s host; the local host
TAG_CLUSTER_SLURM_VERSION = "sq.cluster_slurm_version"  # SLURM_VERSION; "none" for the local launcher
TAG_RANKS = "sq.ranks"  # warm (forked from a preloaded server: start-up not projected) | cold
TAG_SLURM_JOB_ID = "sq.slurm_job_id"
TAG_SLURM_ARRAY_TASK_ID = "sq.slurm_array_task_id"
TAG_SLURM_NODELIST = "sq.slurm_nodelist"
TAG_SLURM_PARTITION = "sq.slurm_partition"
TAG_SLURM_NODENAME = "sq.slurm_nodename"  # the node rank 0 ran on
TAG_SLURM_GPUS = "sq.slurm_gpus"  # GPUs Slurm gave the job (SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES)
TAG_SLURM_GRES = "sq.slurm_gres"  # the GRES the job asked for (gpu:h100:2)
TAG_GPUS = "sq.gpus"  # total GPUs (ranks) of the run
# <sweep id>/<candidate without nodes x GPUs per node>: its points at several sizes, one series
TAG_SERIES = "sq.series"
TAG_RESTARTS = "sq.restart_count"
TAG_MEM_VERDICT = "sq.mem_verdict"  # fits | tight | does_not_fit
TAG_MEM_SOURCE = "sq.mem_source"  # cuda_max_allocated | rss
TAG_PRICE_DATE = "sq.price_date"
TAG_PRICE_SOURCE = "sq.price_source"
TAG_PEAK_SOURCE = "sq.peak_source"
TAG_PARENT_KIND = "sq.kind"  # "sweep" on the parent run, "point" on children
TAG_REF_PREFIX = "sq.ref."  # sq.ref.<metric> = "pass" | "fail: <reason>"
TAG_VERDICT = "sq.verdict"  # pass | fail, against the references
TAG_SWEEP = "sq.sweep"  # the parent run's sweep config (conf/sweep/<name>)
TAG_POINTS = "sq.points"  # the parent run's number of points
TAG_OVERRIDES = "sq.overrides"  # the parent run's command-line overrides, space-separated
TAG_ADAPTIVE = "sq.adaptive"  # the parent run of an adaptive sweep: the most repeats a candidate may get
TAG_ADAPTIVE_ENDED = "sq.adaptive.ended"  # why its rounds ended (a Slurm sweep's last controller)
TAG_ADAPTIVE_ROUNDS = "sq.adaptive.rounds"  # how many rounds ran
TAG_ADAPTIVE_CONTROLLER_S = (
    "sq.adaptive.controller_s"  # its controller jobs' sacct seconds: overhead, no candidate's
)
TAG_GPU_DRIVER = "sq.gpu_driver"  # "<driver> (CUDA <version>)" of rank 0's GPU, or why there is none
TAG_GPU_MISMATCH = "sq.gpu_mismatch"  # the GPU the job sees is not the partition's type
TAG_RESTART_REASON = "sq.restart_reason"  # why the previous attempt stopped (its stop reason)
TAG_RESUME_NOTE = "sq.resume_note"  # a resume that skipped checkpoints: fell back, or found none valid
TAG_LAST_STOP = "sq.last_stop"  # the stop reason of the attempt that just requeued
# the container the ranks ran in (pipeline/job/stack.py): <kind>:<image> | none; the image's
# identity (sha256 of the .sif/squashfs file or of the bundle's config.json, or the registry
# digest); every rank's "<rank>:<host>:<mnt ns>:<pid ns>:pid<n>" and the host's mount namespace
TAG_CONTAINER = "sq.container"
TAG_CONTAINER_DIGEST = "sq.container.digest"
TAG_CONTAINER_MNTNS = "sq.container.mntns"
TAG_CONTAINER_HOST_MNTNS = "sq.container.host_mntns"
TAG_CONTAINER_INSIDE = "sq.container.inside"  # yes: every rank's mount namespace is not the host's
# the software stack, one tag each, absent where not readable (no driver on a CPU node)
STACK_PREFIX = "sq.stack."
STACK_NAMES = (
    "driver",
    "cuda",
    "cudnn",
    "nccl",
    "python",
    "torch",
    "deepspeed",
    "transformers",
    "peft",
    "bitsandbytes",
)


def stack_tag(name: str) -> str:
    """sq.stack.<name>: driver | cuda | cudnn | nccl | python | torch | deepspeed | ..."""
    return STACK_PREFIX + name


# MLflow refuses to change a param: a later attempt's new value is the tag sq.param_changed.<param>
TAG_PARAM_CHANGED_PREFIX = "sq.param_changed."
TAG_MLFLOW_PARENT = "mlflow.parentRunId"  # MLflow's own: the parent run of a nested run
# the MLflow UI's own tag prefix for a shared view of an experiment's runs table: <prefix><key>
TAG_MLFLOW_SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
TAG_DATA = "sq.data"  # the data preset: synthetic | tokens | text (and its file for tokens/text)
# the data wherever it lies: <dtype>:<tokens>:<sha256 of sampled blocks> (TokenFile.fingerprint), or
# synthetic:alphabet=<n>; sweeps whose data differ are refused one report (analysis/workload.py)
TAG_DATA_FINGERPRINT = "sq.data_fingerprint"
# a run moved from another store (`qualify import`, pipeline/tracking/transfer.py)
TAG_ORIGIN_RUN_ID = "sq.origin_run_id"  # its id in the store it was first logged to: imports key on it
TAG_ORIGIN_STORE = "sq.origin_store"  # that store's URI, without credentials
TAG_IMPORT_COMPLETE = "sq.import_complete"  # "1" once all of it was imported (set last)
TAG_NOTE = "mlflow.note.content"  # a run's description in the MLflow UI (the parent's summary)
# MLflow 3's UI opens an experiment by its kind: the GenAI overview unless told it holds model
# training runs (the values are the UI's ExperimentKind enum)
EXP_TAG_KIND = "mlflow.experimentKind"
EXP_KIND_TRAINING = "custom_model_development"
# the parent run's summary when it closes: sq.sweep.points.<outcome> (count) and
# sq.sweep.points.<partition>.<outcome> (count), logged once
SWEEP_POINTS_PREFIX = "sq.sweep.points."

# outcomes and failure reasons: pipeline/contract/outcome.py (values, not keys)


def cluster_tags(cluster: Mapping[str, str]) -> dict[str, str]:
    """The sq.cluster* tags of a recorded cluster identity ({name, controller, slurm_version},
    a manifest's or a spec's `cluster`); none for one recorded before clusters were."""
    names = {
        "name": TAG_CLUSTER,
        "controller": TAG_CLUSTER_CONTROLLER,
        "slurm_version": TAG_CLUSTER_SLURM_VERSION,
    }
    return {tag: cluster[field] for field, tag in names.items() if cluster.get(field)}


# --- metrics: throughput and efficiency ----------------------------------------------------
PERF_TOKENS_PER_S = "perf/tokens_per_s"  # global tokens per optimizer step / median step time
PERF_STEP_P50_S = "perf/step_time_p50_s"
PERF_STEP_P95_S = "perf/step_time_p95_s"
PERF_STEP_CV = "perf/step_time_cv"
PERF_WARMUP_STEPS = "perf/warmup_steps_excluded"
PERF_TIMED_STEPS = "perf/timed_steps"
PERF_MODEL_FLOPS_PER_TOKEN = "perf/model_flops_per_token"
PERF_ACHIEVED_TFLOPS = "perf/achieved_tflops_per_device"  # model FLOP/s per device, TFLOP/s
PERF_PREFIX = "perf/"  # every throughput and efficiency figure of a run (perf/<what>)
PERF_MFU = "perf/mfu"  # fraction vs catalog peak; absent when the device is unknown
PERF_HFU = "perf/hfu"  # fraction vs catalog peak, hardware FLOPs (recompute counted)
PERF_CEILING_TFLOPS = "perf/measured_ceiling_tflops"  # measured matmul TFLOP/s per device
PERF_MFU_VS_CEILING = "perf/mfu_vs_measured_ceiling"  # fraction
PERF_STEP_TIME_S = "perf/step_time_s"  # per step (step index = optimizer step)

TRAIN_LOSS = "train/loss"  # per step
TRAIN_FINAL_LOSS = "train/final_loss"
TRAIN_INITIAL_LOSS = "train/initial_loss"
TRAIN_LOSS_BOUND = "train/loss_bound"
TRAIN_STEPS = "train/steps_done"
TRAIN_TOKENS = "train/tokens_done"  # global tokens of the steps that count (not redone)
TRAIN_PARAMS = "train/params"
TRAIN_NON_EMBEDDING_PARAMS = "train/non_embedding_params"
TRAIN_TRAINABLE_PARAMS = "train/trainable_params"  # parameters the optimizer updates (adapters only for lora)
TRAIN_TRAINABLE_FRAC = "train/trainable_frac"  # trainable / train/params

# --- data path and evaluation ----------------------------------------------------------------
DATA_WAIT_S = "data/wait_s"  # per step: seconds the step waited for its micro-batches (this rank)
DATA_WAIT_FRAC = "data/wait_frac"  # sum of waits / sum of step times over the timed steps, max over ranks
DATA_READ_TOKENS_PER_S = "data/read_tokens_per_s"  # loader throughput before training, one rank
DATA_READ_MB_PER_S = (
    "data/read_mb_per_s"  # token-file bytes read per second by that loader (absent: synthetic)
)
DATA_TRAIN_TOKENS = "data/train_tokens"  # tokens of the training split (absent: synthetic)
DATA_EVAL_TOKENS = "data/eval_tokens"  # tokens of the held-out split (absent: synthetic)
# data=chat (docs/data.md): counts after masking and the seq_len fit, and throughput three ways
DATA_SAMPLES = "data/samples"  # samples of the training split kept
DATA_LOSS_TOKENS = "data/loss_tokens"  # loss-bearing tokens of the training split (targets not -100)
DATA_EVAL_SAMPLES = "data/eval_samples"  # samples of the held-out split
DATA_EVAL_LOSS_TOKENS = "data/eval_loss_tokens"  # loss-bearing tokens of the held-out split
DATA_TRUNCATED = "data/truncated"  # samples cut to model.seq_len + 1 tokens (data.overlong=truncate)
DATA_DROPPED_OVERLONG = "data/dropped_overlong"  # samples longer than that, dropped (data.overlong=drop)
DATA_DROPPED_UNTRAINED = "data/dropped_untrained"  # samples with no loss-bearing token, dropped
DATA_PACK_FILL = "data/pack_fill"  # packed: real positions / (bins x seq_len) of the training split
DATA_PADDING_EFFICIENCY = "data/padding_efficiency"  # real tokens / positions computed, over the run's steps
DATA_REAL_TOKENS_PER_S = "data/real_tokens_per_s"  # non-pad positions per step (mean) / median step time
DATA_LOSS_TOKENS_PER_S = "data/loss_tokens_per_s"  # loss-bearing tokens per step (mean) / median step time
PARAM_DATA_LENGTHS = "data.lengths."  # + prompt_p50 | prompt_p95 | prompt_max | answer_*: tokens, params
EVAL_LOSS = "eval/loss"  # per evaluation, at its step (step 0: before the first step)
EVAL_FIRST_LOSS = "eval/first_loss"  # before the first step: the basis of a relative target
EVAL_FINAL_LOSS = "eval/final_loss"  # at the last step done
EVAL_TIME_S = "eval/time_s"  # seconds spent evaluating (this attempt)
TARGET_EVAL_LOSS = "target/eval_loss"  # accept.target_eval_loss in nats per token
TARGET_STEPS = "target/steps"  # first evaluated step at or below the target (absent: not reached)
TARGET_TIME_S = "target/time_s"  # target/steps x median step time
TARGET_GPU_HOURS = "target/gpu_hours"  # target/time_s x ranks / 3600
TARGET_USD = "target/usd"  # target/gpu_hours x price (absent: no price)

# --- memory ----------------------------------------------------------------------------
MEM_PEAK_ALLOCATED_GIB = "mem/peak_allocated_gib"  # torch.cuda.max_memory_allocated (GPU)
MEM_PEAK_RESERVED_GIB = "mem/peak_reserved_gib"  # torch.cuda.max_memory_reserved (GPU)
MEM_PEAK_RSS_GIB = "mem/peak_rss_gib"  # process peak RSS (CPU runs)
MEM_CAPACITY_GIB = "mem/capacity_gib"  # per device
MEM_HEADROOM_FRAC = "mem/headroom_frac"  # 1 - peak tensor bytes (cuda max allocated; CPU: RSS) / capacity
MEM_ESTIMATE_TENSORS_GIB = "mem/estimate_tensors_gib"  # the model's tensor bytes, no context/fragmentation
MEM_STATES_MEASURED_GIB = (
    "mem/states_measured_gib"  # parameter + optimizer tensors one rank holds after training (max rank)
)
MEM_STATES_RATIO = (
    "mem/states_measured_over_predicted"  # measured / the memory model's parameter + optimizer bytes
)
MEM_ESTIMATE_HEADROOM_FRAC = (
    "mem/estimate_headroom_frac"  # 1 - estimate_tensors / capacity: mem/headroom_frac's basis
)
MEM_ESTIMATE_GIB = "mem/estimate_gib"  # the memory model's per-device total
MEM_ESTIMATE_MODEL_STATES_GIB = "mem/estimate_model_states_gib"
MEM_ESTIMATE_ACTIVATIONS_GIB = "mem/estimate_activations_gib"

# --- micro-batch search (search.micro_batch=true) --------------------------------------
SEARCH_MICRO_BATCH = "search/micro_batch"  # the largest that fits with search.headroom (the run's size)
SEARCH_TRIALS = "search/trials"  # trials run
SEARCH_TOKENS_PER_S = "search/tokens_per_s"  # throughput at the found size (its trial)
SEARCH_WALL_S = "search/wall_s"  # the search's wall time
SEARCH_TRIAL_MICRO_BATCH = "search/trial_micro_batch"  # per trial (step = trial index)
SEARCH_TRIAL_FITS = "search/trial_fits"  # 1 fits, 0 out of memory or over the headroom
SEARCH_TRIAL_PEAK_GIB = "search/trial_peak_gib"  # peak allocated (GPU) or peak RSS (CPU) of the trial
SEARCH_TRIAL_TOKENS_PER_S = "search/trial_tokens_per_s"  # absent for a trial that did not run a step

# --- communication ------------------------------------------------------------------------
COMM_ALLREDUCE_BUSBW = "comm/allreduce_busbw_gbps"  # GB/s, plateau over large sizes
COMM_ALLGATHER_BUSBW = "comm/allgather_busbw_gbps"
COMM_REDUCESCATTER_BUSBW = "comm/reducescatter_busbw_gbps"
# per timed step (pipeline/train/commtimer.py, rank 0; the first step is not timed)
PERF_TIMED_STEP_S = "perf/timed_step_s"  # the step time of the step split below (perf/step_time_s there)
PERF_COMPUTE_S = "perf/compute_s"  # step - exposed communication - optimizer step - data wait
PERF_OPTIMIZER_S = "perf/optimizer_s"  # engine.step() less the collectives inside it
COMM_EXPOSED_S = "comm/exposed_s"  # time lost at collectives: their transfers + the waits for peers
COMM_SKEW_S = "comm/skew_s"  # of which the waits for the other ranks (the barrier before each collective)
COMM_STEP_BYTES = "comm/step_bytes"  # nccl-tests sizes of the step's collectives, summed
COMM_STEP_WIRE_BYTES = "comm/step_wire_bytes"  # the same x their bus factors: bytes per rank on the wire
COMM_STEP_CALLS = "comm/step_calls"
COMM_STEP_BUSBW = "comm/step_busbw_gbps"  # wire bytes / transfer time (exposed - skew), GB/s
COMM_STEP_OPS = ("all_reduce", "all_gather", "reduce_scatter", "reduce", "broadcast")


def _per_op(prefix: str, op: str, suffix: str) -> str:
    """The key of one collective: `<prefix><op><suffix>`, op one of COMM_STEP_OPS."""
    if op not in COMM_STEP_OPS:
        raise ValueError(f"unknown collective {op!r}")
    return f"{prefix}{op}{suffix}"


def comm_step_op_bytes(op: str) -> str:
    """comm/step_<op>_bytes: one collective's nccl-tests bytes in the step."""
    return _per_op("comm/step_", op, "_bytes")


def comm_step_op_calls(op: str) -> str:
    """comm/step_<op>_calls: its calls in the step."""
    return _per_op("comm/step_", op, "_calls")


def comm_bucket_op_bytes(op: str) -> str:
    """comm/bucket_<op>_bytes: the nccl-tests size of the ZeRO stage's message of this collective
    (its bucket, or the whole model under it), as the probe timed it."""
    return _per_op("comm/bucket_", op, "_bytes")


def comm_bucket_op_busbw(op: str) -> str:
    """comm/bucket_<op>_busbw_gbps: the probe's bus bandwidth at that size (GB/s)."""
    return _per_op("comm/bucket_", op, "_busbw_gbps")


def comm_step_op_busbw(op: str) -> str:
    """comm/step_<op>_busbw_gbps: its wire bytes / its transfer time (GB/s)."""
    return _per_op("comm/step_", op, "_busbw_gbps")


# --- checkpoint ---------------------------------------------------------------------------
CKPT_SAVE_S = "ckpt/save_s"  # start of the save to its commit (files durable on every rank)
CKPT_STALL_S = "ckpt/stall_s"  # what the step loop waits for a save: the previous one + the host copy
CKPT_LOAD_S = "ckpt/load_s"
CKPT_BYTES = "ckpt/bytes"
CKPT_SAVE_GBPS = "ckpt/save_gbps"
CKPT_LOAD_GBPS = "ckpt/load_gbps"
CKPT_VERIFIED = "ckpt/verified"  # 1.0 when the restored state hashes equal the saved ones
CKPT_SAVES = "ckpt/saves"
CKPT_VERIFIED_COUNT = "ckpt/verified_count"  # checkpoints that passed restore verification
CKPT_FALLBACKS = "ckpt/fallbacks"  # loads that fell back to an older checkpoint

# --- start-up (one point per attempt, step = the attempt's index) ---------------------------
STARTUP_IMPORT_S = "startup/import_s"  # process start -> torch and DeepSpeed imported
STARTUP_PROCESS_GROUP_S = "startup/process_group_s"  # init_process_group
STARTUP_MODEL_BUILD_S = "startup/model_build_s"  # the model built on the host
STARTUP_ENGINE_INIT_S = "startup/engine_init_s"  # deepspeed.initialize
STARTUP_CKPT_LOAD_S = "startup/ckpt_load_s"  # looking for, checking and loading the checkpoint
STARTUP_WARM_IMPORT_S = "startup/warm_import_s"  # warm ranks only: the server's imports, paid once
TAG_STARTUP_NODE_PREFIX = "sq.startup."  # sq.startup.<node> = "import_s=<s> model_build_s=<s>"

# --- restart (drills) ----------------------------------------------------------------------
RESTART_SIGNAL_TO_EXIT_S = "restart/signal_to_exit_s"
RESTART_EXIT_TO_START_S = "restart/exit_to_start_s"  # requeue + queue wait
RESTART_START_TO_READY_S = "restart/start_to_ready_s"  # imports, init, engine
RESTART_LOAD_S = "restart/load_s"
RESTART_FIRST_STEP_S = "restart/first_step_s"
RESTART_TOTAL_S = "restart/total_s"  # signal -> first optimizer step after resume
RESTART_LOST_STEPS = "restart/lost_steps"
# every attempt, cold or restarted (step = its index): process start -> first optimizer step done
# (imports, process group, probes, engine, checkpoint load, first step): a restart without the
# signal-to-exit and the queue wait
RESTART_COLD_START_S = "restart/cold_start_s"
ATTEMPTS = "run/attempts"

# --- reshape drill (resume on another number of ranks, universal checkpoint) ----------------
RESHAPE_WORLD_SIZE = "reshape/world_size"  # ranks of the resumed run
RESHAPE_FROM_STEP = "reshape/from_step"
RESHAPE_CONVERT_S = "reshape/convert_s"  # ds_to_universal
RESHAPE_START_TO_READY_S = "reshape/start_to_ready_s"
RESHAPE_LOAD_S = "reshape/load_s"
RESHAPE_FIRST_STEP_S = "reshape/first_step_s"
RESHAPE_TOTAL_S = "reshape/total_s"  # save at from_step done -> first step of the resumed run done
RESHAPE_MAX_LOSS_DIFF = "reshape/max_loss_diff"  # against the uninterrupted run on the job's ranks

# --- time and goodput -------------------------------------------------------------------
TIME_ALLOCATED_S = "time/allocated_s"  # wall time of this attempt (cumulated over attempts)
TIME_PRODUCTIVE_S = "time/productive_s"  # step time of steps that count
TIME_STARTUP_S = "time/startup_s"
# sacct Eligible -> Start of one allocation (step = the attempt's index); Slurm only (absent on
# the local launcher: nothing queues there)
TIME_QUEUE_WAIT_S = "time/queue_wait_s"
TIME_CKPT_SAVE_S = "time/ckpt_save_s"
TIME_CKPT_LOAD_S = "time/ckpt_load_s"
TIME_LOST_S = "time/lost_work_s"
TIME_DRILLS_S = "time/drills_s"
TIME_IDLE_S = "time/idle_s"
GOODPUT = "time/goodput"  # productive / allocated device time

# --- cost -----------------------------------------------------------------------------
COST_USD = "cost/usd_run"  # all attempts, all parts
COST_COMPUTE_USD = "cost/usd_compute"
COST_STORAGE_USD = "cost/usd_storage"
COST_EGRESS_USD = "cost/usd_egress"
COST_OVERHEAD_USD = "cost/usd_overhead"
COST_LABOR_USD = "cost/usd_labor"
COST_PRICE_USD_PER_GPU_HOUR = "cost/price_usd_per_gpu_hour"
COST_GPU_HOURS = "cost/gpu_hours"
COST_REUSABLE_USD = "cost/usd_reusable"  # value of verified checkpoints, subtracted from the total
COST_EGRESS_GB = "cost/egress_gb"  # bytes shipped off-site (cost.ship_checkpoints), 1e9 bytes
COST_FAILURES_NEEDING_PERSON = "cost/failures_needing_person"  # attempts charged labor
# the report's figures for the run's candidate, logged by `make report` on each of the candidate's
# runs (the same value on each), so the MLflow runs table can show them beside the run's own
CAND_USD_PER_FINISHED_RUN = "candidate/usd_per_finished_run"
CAND_USD_PER_CHECKPOINT = "candidate/usd_per_successful_checkpoint"
TAG_ALLOCATED_SOURCE = "sq.allocated_source"  # sacct | process_clock: where allocated time came from
ALLOCATED_SACCT = "sacct"  # Slurm accounting: ElapsedRaw x AllocTRES gres/gpu, requeues included
ALLOCATED_SACCT_FINAL = "sacct_final"  # the same, re-read by the login node once the job ended
ALLOCATED_PROCESS_CLOCK = "process_clock"  # no Slurm: the job's own wall time x its ranks

# --- node health, telemetry, energy, stragglers (pipeline/job/health.py, telemetry.py, straggler.py)
TAG_HEALTH = "sq.health"  # healthy | degraded | failed: the worst node's verdict
TAG_HEALTH_NODE_PREFIX = "sq.health."  # sq.health.<node> = "<verdict>[: findings]"
TAG_HEALTH_NOTES = "sq.health_notes"  # checks skipped, and why
TAG_UNHEALTHY_NODES = "sq.unhealthy_nodes"  # comma-separated nodes that failed the gate
HEALTH_MATMUL_SPREAD = "health/matmul_spread"  # largest (max - min) / max GPU ceiling spread of a node
HEALTH_SECONDS = "health/gate_s"  # wall time of the gate on rank 0
SYS_PREFIX = "sys/"  # sys/<node>/gpu<i>/<what> and sys/<node>/<what>: samples, step = Unix time in ms
ENERGY_GPU_KWH = "energy/gpu_kwh"  # the job's GPUs, counter differences, all attempts
ENERGY_HOST_KWH = "energy/host_kwh"  # RAPL packages of every node, all attempts; absent if not readable
ENERGY_GPU_MEAN_POWER_W = "energy/gpu_mean_power_w"  # per GPU: energy / sampled window / GPUs
ENERGY_WINDOW_S = "energy/window_s"  # the sampled window of this attempt
TAG_ENERGY_NOTE = "sq.energy_note"  # why an energy figure is absent
COST_ENERGY_USD = "cost/usd_energy"  # (GPU + host) kWh x PUE x $/kWh; absent without a price or a counter
PERF_STRAGGLER_SCORE = "perf/straggler_score"  # slowest rank's median forward time / fastest rank's
PERF_RANK_FORWARD_P50_S = "perf/rank_forward_p50_s"  # per rank (step = rank): median forward seconds
TAG_STRAGGLER_RANK = "sq.straggler_rank"  # the slowest rank
TAG_STRAGGLER_NODE = "sq.straggler_node"  # its node

# --- artifacts -----------------------------------------------------------------------------
ARTIFACT_CONFIG = "config.yaml"
ARTIFACT_DS_CONFIG = "ds_config.json"
ARTIFACT_LEDGER = "ledger"  # an imported run's ledger folder (the events it was logged from)
