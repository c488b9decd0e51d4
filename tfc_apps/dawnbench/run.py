"""DAWNBench ResNet-50 (shi2021 §5.6): progressive resizing, a collective schedule (MSTopK-SGD then
2DTAR-SGD), LARS/LAMB through PTO, DataCache, per-rank checkpoints; run on every rank of a job::

  horovodrun -np 4 -H localhost:4 --gloo python scripts/dawnbench_resnet50.py --synthetic
"""
import functools
import json
import os

import keras
import numpy as np
import tensorflow as tf

import tf_commlib
from tf_commlib import primitives
from tfc_apps.dawnbench import breakdown, config, models
from tfc_apps.dawnbench.data import Data
from tfc_apps.dawnbench.report import EpochReport, Log, Reporter
from tfc_apps.dawnbench.schedule import PEAK_PER_256, StagedLinear
from tf_commlib.keras import (DGC, Auto, BackupAndRestore, DiLoCo, DistributedOptimizer, Selection, default_callbacks,
                              distributed_optimizer)
from tf_commlib.keras.callbacks import MetricAverage


# Biases and batch normalisation: no weight decay, no layer adaptation (variable paths).
EXCLUDED = ["bias", "gamma", "beta"]


def learning_rate(args, data, topo):
    """The run's StagedLinear: its peak scaled by the first stage's global batch on these ranks."""
    stages = args.stage_list
    global_batch = stages[0].batch * topo.size
    peak = args.lr or PEAK_PER_256[args.optimizer] * global_batch / 256
    return StagedLinear(peak, args.warmup_epochs, [s.epochs for s in stages], [data.steps(s) for s in stages])


def make_optimizer(args, data, topo, cost_params=None, compute_s=None, lr=None):
    """The run's optimizer; lr: its learning-rate schedule (default learning_rate's)."""
    lr = lr if lr is not None else learning_rate(args, data, topo)
    if args.optimizer == "lars":
        import pto

        inner = pto.LARS(lr, momentum=args.momentum, weight_decay_rate=args.weight_decay, eeta=args.eeta,
                         exclude_from_weight_decay=EXCLUDED, exclude_from_layer_adaptation=EXCLUDED)
    elif args.optimizer == "lamb":
        import pto

        inner = pto.LAMB(lr, weight_decay=args.weight_decay)
        inner.exclude_from_weight_decay(var_names=EXCLUDED)
    else:
        inner = keras.optimizers.SGD(lr, momentum=args.momentum, weight_decay=args.weight_decay)
        inner.exclude_from_weight_decay(var_names=EXCLUDED)
    if args.diloco:   # the inner optimizer keeps its momentum; the outer one is Nesterov SGD
        outer = keras.optimizers.SGD(args.outer_lr, momentum=args.outer_momentum, nesterov=True)
        return DiLoCo(inner, sync_every=args.diloco, outer_optimizer=outer, inter_compression=args.inter_compression,
                      overlap=not args.no_overlap)
    dgc = DGC(momentum=None if args.optimizer != "lamb" else args.momentum,
              # sharded: the wrapped optimizer's momentum, kept in slices (DGC's correction keeps a
              # full-size velocity per rank)
              momentum_correction=args.optimizer != "lamb" and not args.shard_optimizer,
              momentum_masking=args.momentum_masking, warmup=args.dgc_warmup)
    return DistributedOptimizer(inner, algorithm=args.schedule_map[0], density=args.density, dgc=dgc,
                                selection=Selection(selector=args.selector, seed=args.seed),
                                schedule=args.schedule_map, compression=args.compression,
                                overlap=not args.no_overlap,
                                auto=Auto(cost_params=cost_params, compute_s=compute_s, probe=args.calibrate or None,
                                          candidates=args.auto_candidates and tuple(args.auto_candidates)),
                                shard_optimizer=args.shard_optimizer,
                                algorithm_options=(None if args.powersgd_rank is None
                                                   else {"powersgd": {"rank": args.powersgd_rank}}),
                                **({} if args.fusion_threshold_bytes is None
                                   else {"fusion_threshold_bytes": args.fusion_threshold_bytes}))


def weights_digest(model, topo):
    """Checks that every rank holds the same weights; returns their digest, or raises naming the
    variables that differ."""
    import hashlib

    codes = [int(hashlib.sha256(v.numpy().tobytes()).hexdigest()[:15], 16) for v in model.variables]
    mine = tf.constant([codes], tf.int64)
    every = primitives.allgather(mine, topo.world).numpy()
    differ = [v.path for j, v in enumerate(model.variables) if len(set(every[:, j].tolist())) != 1]
    if differ:
        raise RuntimeError(f"the ranks' weights differ after training: {len(differ)} of "
                           f"{len(codes)} variables, e.g. {differ[:5]}")
    return hashlib.sha256(np.asarray(codes, np.int64).tobytes()).hexdigest()


def main(argv=None):
    run(config.parse(argv))


def run(args):
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    topo = tf_commlib.init(args.topology)
    if tf.config.list_physical_devices("GPU"):
        keras.mixed_precision.set_global_policy("mixed_float16")
    data = Data(args, topo)
    try:
        return train(args, topo, data)
    finally:
        data.close()


def calibrate_for(model, topo, args, num_classes, loss):
    """What "auto" chooses with: the link parameters, measured at the sizes of this model's largest
    bucket (costmodel.sizes_for), and the seconds of forward+backward per step that overlapped
    aggregation runs beside (costmodel.compute_seconds on a batch of the first stage's shape). With
    a cache file (--calibration-cache, or calibration.json in --ckpt-dir) both are kept in its
    folder, which also becomes $TF_COMMLIB_CACHE (where auto keeps the candidates' timings):
    measured once per cluster and model."""
    from tf_commlib import costmodel, fusion
    from tf_commlib.keras.optimizer import default_fusion_threshold
    from tf_commlib.keras.policy import default_dense_layers

    threshold = (fusion.bucket_threshold(default_fusion_threshold(args.schedule_map.values()),
                                         [v for v in model.trainable_variables if not default_dense_layers(v)])
                 if args.fusion_threshold_bytes is None else args.fusion_threshold_bytes)
    largest = fusion.largest_bucket(model.trainable_variables, threshold)
    cache = args.calibration_cache or (os.path.join(args.ckpt_dir, "calibration.json") if args.ckpt_dir else None)
    stage, rng = args.stage_list[0], np.random.default_rng(args.seed)
    x = tf.constant(rng.uniform(size=(stage.batch, stage.resolution, stage.resolution, 3)), tf.float32)
    y = tf.one_hot(rng.integers(0, num_classes, stage.batch), num_classes)
    if not cache:
        return costmodel.calibrate(topo, **costmodel.sizes_for(largest)), costmodel.compute_seconds(topo, model, x, y, loss)
    os.environ["TF_COMMLIB_CACHE"] = os.path.dirname(os.path.abspath(cache))
    params, how = costmodel.cached_calibration(topo, cache, remeasure=args.recalibrate,
                                               **costmodel.sizes_for(largest))
    key = costmodel.calibration_key(topo, {"compute": args.model, "shape": list(x.shape), "classes": num_classes,
                                           "policy": keras.mixed_precision.global_policy().name})
    (compute_s,), _ = costmodel.cached_values(
        topo, os.path.join(os.path.dirname(os.path.abspath(cache)), f"compute-{args.model}-{stage.resolution}px-"
                                                                     f"b{stage.batch}.json"),
        key, lambda: [costmodel.compute_seconds(topo, model, x, y, loss)], remeasure=args.recalibrate)
    if topo.rank == 0:
        print(f"dawnbench: link parameters {how} ({cache})", flush=True)
    return params, compute_s


def calibrate(args, topo, data):
    """What a run with --calibrate measures, kept in its cache (--calibration-cache): the link, the
    compute per step and, for a schedule with "auto", every candidate's aggregation of this model's
    buckets; the next runs read them. Returns the seconds it took (rank 0's)."""
    import time

    from tf_commlib.auto.measure import calibrate_link

    if not args.calibrate or not args.calibration_cache:
        raise ValueError("calibrate() keeps what it measures: give --calibrate and --calibration-cache FILE")
    start = time.perf_counter()
    model = models.build(args.model, data.num_classes, args.seed)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing)
    cost_params, compute_s = calibrate_for(model, topo, args, data.num_classes, loss)
    model.compile(make_optimizer(args, data, topo, cost_params, compute_s), loss, jit_compile=False)
    opt = distributed_optimizer(model)
    if isinstance(opt, DistributedOptimizer):
        calibrate_link(opt, model.trainable_variables)
    return time.perf_counter() - start


def train(args, topo, data):
    start = BackupAndRestore.resume_epoch(args.ckpt_dir) if args.ckpt_dir else 0
    log = Log(args.log_dir, topo, start, args.target_top5)   # the wall clock starts here
    model = models.build(args.model, data.num_classes, args.seed)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing)
    cost_params, compute_s = (calibrate_for(model, topo, args, data.num_classes, loss) if args.calibrate
                              else (None, None))
    if compute_s is not None and topo.rank == 0:
        print(f"dawnbench: calibrated; forward+backward {compute_s * 1e3:.0f} ms per step (auto_compute_s)",
              flush=True)
    opt = make_optimizer(args, data, topo, cost_params, compute_s)
    model.compile(opt, loss, jit_compile=False)
    opt = distributed_optimizer(model)   # through the LossScaleOptimizer compile adds under mixed_float16
    if topo.rank == 0:
        print(f"dawnbench: {args.model}, {topo.m}x{topo.n} ranks, stages "
              f"{[(s.resolution, s.epochs, s.batch) for s in args.stage_list]}, optimizer {args.optimizer}"
              + (f", resuming at epoch {start}" if start else ""), flush=True)
    # one set for the run: the model is broadcast once, not every stage; the loss is averaged in
    # the report's one allreduce per epoch, with the BN statistics (not by MetricAverage's own)
    common = [c for c in default_callbacks() if not isinstance(c, MetricAverage)]
    stages = args.stage_list
    reporter = Reporter(log, model, topo, last_epoch=stages[-1].first_epoch + stages[-1].epochs - 1)
    if log.resume_unscored is not None:   # the restored model's evaluation, cut by the interruption
        reporter.resume_val = functools.partial(
            data.val, next(s for s in stages if s.first_epoch < start <= s.first_epoch + s.epochs))
    try:
        for stage in stages:
            first, end = max(stage.first_epoch, start), stage.first_epoch + stage.epochs
            if first >= end:
                continue
            # a step function traced for this stage's shapes, in an uninterrupted run as in a resumed one:
            # Keras would reuse one traced with relaxed shapes from an earlier stage, whose kernels round
            # differently, and a resumed run would then not end where an uninterrupted one ends
            model.make_train_function(force=True)
            # one fit for the stage's epochs, over one data set (no per-epoch fit and pipeline start-up)
            val = None if args.synthetic else functools.partial(data.val, stage)   # built by the eval thread
            report = EpochReport(reporter, val, stage, data.steps(stage))
            callbacks = common + [report]
            if args.ckpt_dir:
                callbacks.append(BackupAndRestore(args.ckpt_dir, delete_checkpoint=False))
            model.fit(data.train(stage, first, end - first), initial_epoch=first, epochs=end,
                      steps_per_epoch=data.steps(stage), verbose=0, shuffle=False, callbacks=callbacks)
            if args.breakdown_steps and opt.algorithm_at(end - 1) == "diloco":   # no collective to time apart
                if topo.rank == 0:
                    print("breakdown: not measured, the last epoch ran auto's DiLoCo rounds", flush=True)
            elif args.breakdown_steps:
                algorithm = opt.algorithm_at(end - 1)
                phases = breakdown.measure(model, opt, data.train(stage, stage.first_epoch), loss, algorithm,
                                           opt.density_at(end - 1), args.selector, topo, args.breakdown_steps)
                if topo.rank == 0:
                    print(breakdown.table(stage, phases, report.step_s), flush=True)
                    with open(os.path.join(args.log_dir, "breakdown.jsonl"), "a") as f:
                        f.write(json.dumps({"resolution": stage.resolution, "algorithm": algorithm,
                                            "step_s": report.step_s, **phases}) + "\n")
    finally:
        reporter.close()
    digest = weights_digest(model, topo)
    cache_line = data.stats_line()
    if topo.rank == 0:
        if cache_line:
            print(cache_line, flush=True)
        print(f"weights identical on all {topo.size} ranks: sha256 {digest}", flush=True)
        if isinstance(opt, DistributedOptimizer) and opt.sharded_state_bytes() is not None:
            mine, full = opt.sharded_state_bytes()
            print(f"optimizer state sharded: {mine / 1e6:.1f} MB per rank, {mine / max(full, 1):.3f} of "
                  f"unsharded {full / 1e6:.1f} MB", flush=True)
        if log.tta is None:
            print(f"time-to-accuracy: top-5 {args.target_top5} not reached", flush=True)
        if isinstance(opt, DistributedOptimizer) and opt.auto_epochs is not None:   # "auto"'s decisions and
            with open(os.path.join(args.log_dir, "auto_log.jsonl"), "a" if start else "w") as f:   # their grounds
                f.writelines(json.dumps(row, default=float) + "\n" for row in opt.auto_log)
        log.plot(os.path.join(args.log_dir, "accuracy_throughput.png"))
    return log.rows


if __name__ == "__main__":
    main()
