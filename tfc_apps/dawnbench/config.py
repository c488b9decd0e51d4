"""Command line of the DAWNBench script: progressive-resizing stages and their validation."""
import argparse
import dataclasses
import os

DEFAULT_STAGES = "96:13:256,128:11:256,224:3:256,288:1:128"   # shi2021 §5.6, batch per GPU


def default_schedule(stages):
    """The first stage chooses its collective each epoch (DistributedOptimizer's default, "auto"),
    the later ones run 2dtar as shi2021's recipe does (its own: 0:hitopk,13:2dtar for the default
    stages)."""
    return "0:auto" + (f",{stages[1].first_epoch}:2dtar" if len(stages) > 1 else "")


@dataclasses.dataclass(frozen=True)
class Stage:
    resolution: int
    epochs: int
    batch: int           # per rank
    first_epoch: int     # global index of the stage's first epoch


# The smallest input each model takes: ResNet-50 halves it 5 times, the small model twice.
MIN_RESOLUTION = {"resnet50": 32, "small": 8}


def parse_stages(text, epoch_scale=1.0, min_resolution=32):
    """'96:13:256,128:11:256' -> [Stage(96, 13, 256, 0), Stage(128, 11, 256, 13)]; every stage's
    epochs are scaled by epoch_scale and kept >= 1; every resolution is >= min_resolution."""
    if not epoch_scale > 0:
        raise ValueError(f"--epoch-scale must be positive, got {epoch_scale!r}")
    stages, first = [], 0
    for part in str(text).split(","):
        fields = part.strip().split(":")
        try:
            res, epochs, batch = (int(f) for f in fields)
        except ValueError:
            raise ValueError(f"--stages: {part.strip()!r} is not resolution:epochs:batch "
                             "(three integers), e.g. 96:13:256") from None
        if res < min_resolution or epochs < 1 or batch < 1:
            raise ValueError(f"--stages: {part.strip()!r} needs resolution >= {min_resolution}, epochs >= 1, "
                             "batch >= 1")
        epochs = max(1, round(epochs * epoch_scale))
        stages.append(Stage(res, epochs, batch, first))
        first += epochs
    return stages


def parse_schedule(text):
    """'0:hitopk,13:2dtar' -> {0: 'hitopk', 13: '2dtar'} (checked against the registry later)."""
    out = {}
    for part in str(text).split(","):
        try:
            epoch, name = part.split(":")
            out[int(epoch)] = name.strip()
        except ValueError:
            raise ValueError(f"--schedule: {part!r} is not epoch:algorithm, e.g. 0:hitopk,13:2dtar") from None
    if 0 not in out:
        raise ValueError(f"--schedule must start at epoch 0, got {text!r}")
    return out


def _interval(text):
    """--diloco's H: an int, or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int or 'auto', got {text!r}") from None


def check_algorithms(schedule, auto_candidates=None):
    """Last of the checks: the registry imports TensorFlow. Returns the candidates' registered names
    (a BASE:KEY=VALUE setting registered: tf_commlib.collectives.setting)."""
    from tf_commlib.collectives import ALGORITHMS, setting

    unknown = sorted(set(schedule.values()) - set(ALGORITHMS) - {"auto"})
    if unknown:
        raise ValueError(f"--schedule: unknown algorithm(s) {unknown}; known: {sorted(ALGORITHMS) + ['auto']}")
    if auto_candidates is not None:   # the library's own check, named by the flag
        from tf_commlib.keras import Auto

        try:
            auto_candidates = [setting(c) if ":" in c else c for c in auto_candidates]   # names: Auto's check
            Auto(candidates=tuple(auto_candidates))
        except ValueError as e:
            raise ValueError(f"--auto-candidates: {e}") from None
    return auto_candidates


def check_val(args):
    """val/ of --data: class folders, or with --val-labels a flat folder whose every image has a
    label of a train/ class and every label an image (read here, so a bad file exits 2 at once)."""
    from datacache.sources import IMAGE_EXTENSIONS, class_folders, flat_folder_labels

    val = os.path.join(args.data, "val")
    if args.val_labels:
        flat_folder_labels(val, args.val_labels, class_folders(os.path.join(args.data, "train")),
                           argument="--val-labels")
    elif not class_folders(val) and any(e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS
                                        for e in os.scandir(val)):
        raise ValueError(f"--data {args.data!r}: val/ holds images, not class folders: give --val-labels FILE "
                         "(one line per image: NAME LABEL)")


def parser():
    p = argparse.ArgumentParser(prog="scripts/dawnbench_resnet50.py", description=__doc__)
    a = p.add_argument
    a("--stages", default=DEFAULT_STAGES, help="resolution:epochs:batch per rank, comma separated")
    a("--epoch-scale", type=float, default=1.0, help="scales every stage's epochs (small runs)")
    a("--steps-per-epoch", type=int, default=None, help="cut epochs short (and synthetic epoch length)")
    a("--schedule", default=None,
      help="epoch:algorithm switches (default 0:auto, then 2dtar from the second stage on: 0:auto,13:2dtar "
           "for the default stages; shi2021's recipe is 0:hitopk,13:2dtar)")
    a("--density", type=float, default=0.01)
    a("--selector", default="mstopk")
    a("--powersgd-rank", type=int, default=None,
      help="the rank of PowerSGD's factors where --schedule runs powersgd or auto (default: the library's, 4)")
    a("--compression", choices=("none", "fp16", "bf16"), default="none",
      help="16-bit values on the wire of dense and 2dtar (Horovod's Compression.fp16)")
    a("--no-overlap", action="store_true",
      help="aggregate after the whole of backprop (default: each bucket as soon as its gradients exist)")
    a("--fusion-threshold-bytes", type=int, default=None, help="gradient bucket size (default: the library's)")
    a("--calibrate", action="store_true",
      help="measure the link parameters (tf_commlib.costmodel.calibrate) and the forward+backward seconds "
           "per step at the first stage's batch (costmodel.compute_seconds) first, for the schedule's 'auto'; "
           "the seconds it takes count in the wall time")
    a("--calibration-cache", default=None, metavar="FILE",
      help="with --calibrate: keep the link parameters in FILE and reuse them on the same layout, hosts and "
           "sizes (tf_commlib.costmodel.cached_calibration); default: calibration.json in --ckpt-dir if given")
    a("--recalibrate", action="store_true", help="with --calibration-cache: measure again and rewrite FILE")
    a("--auto-candidates", nargs="+", default=None, metavar="ALGORITHM",
      help="the collectives the schedule's 'auto' chooses among (Auto(candidates=...); default: the library's, "
           "with DiLoCo rounds where there are nodes); e.g. one lossy collective, to log its measured efficiency; "
           "BASE:KEY=VALUE names BASE at another setting (powersgd:rank=1, hitopk:density_scale=0.1)")
    a("--shard-optimizer", action="store_true",
      help="ZeRO-1: each rank updates and keeps optimizer state for its slice only, and the weights are "
           "all-gathered (DistributedOptimizer(shard_optimizer=True)): slices of 1/P with one dense or 2dtar "
           "algorithm for the whole --schedule, else (hitopk, switches) 1/n over a node's ranks, the weights "
           "all-gathered inside the node; DGC's momentum correction is off (the wrapped optimizer's momentum "
           "is kept in slices). The step breakdown still times the unsharded update")
    a("--diloco", type=_interval, default=0, metavar="H",
      help="DiLoCo (tf_commlib.keras.DiLoCo): the optimizer steps locally inside each node (gradients averaged over "
           "the node) and the nodes average their pseudo-gradients every H steps and at each epoch end, through an "
           "outer Nesterov SGD; 'auto': H chosen at each epoch end from the measured step and exchange times; "
           "--schedule, --density and the DGC options do not apply (default 0: off)")
    a("--inter-compression", default=None, choices=("fp16", "bf16", "int8", "int4", "qsgd8"),
      help="with --diloco: the codec of the pseudo-gradients between nodes (default float32)")
    a("--outer-lr", type=float, default=0.7, help="with --diloco: the outer SGD's learning rate")
    a("--outer-momentum", type=float, default=0.9, help="with --diloco: the outer SGD's Nesterov momentum")
    a("--dgc-warmup", type=int, default=None,
      help="DGC density warm-up epochs (default: 2 where --schedule runs auto, as DistributedOptimizer without "
           "dgc=; else 0)")
    masking = p.add_mutually_exclusive_group()
    masking.add_argument("--momentum-masking", action="store_true",
                         help="DGC's momentum factor masking: zero the momentum where a sparse collective sent v "
                              "(DGC(momentum_masking=True); off by default: bench tta measured it 2.5-3.3 points lower)")
    masking.add_argument("--no-momentum-masking", action="store_true",
                         help="keep DGC's momentum where a sparse collective sent v (the default, DGC()): the sent "
                              "values then add up to exactly what momentum SGD applies, only later")
    a("--optimizer", choices=("lars", "lamb", "sgd"), default="lars")
    a("--lr", type=float, default=None, help="peak learning rate (default per optimizer)")
    a("--warmup-epochs", type=float, default=2.0, help="linear LR warm-up, then linear decay to 0")
    a("--momentum", type=float, default=0.9)
    a("--weight-decay", type=float, default=5e-5, help="not applied to BN and bias variables")
    a("--eeta", type=float, default=0.001, help="LARS trust coefficient")
    a("--label-smoothing", type=float, default=0.1)
    a("--model", choices=("resnet50", "small"), default="resnet50")
    a("--data", default=None, help="DIR with train/ and val/ in ImageNet layout (through DataCache)")
    a("--val-labels", default=None, metavar="FILE",
      help="val/ of --data is one flat folder of images (ImageNet's validation set) labelled by FILE: one "
           "line per image, 'NAME LABEL' or 'NAME,LABEL' (NAME a file name, its extension optional; LABEL a "
           "class folder name of train/ or a 0-based index into the sorted class folders), or ImageNet's "
           "LOC_val_solution.csv (ImageId,PredictionString: the first word is the synset)")
    a("--tfds", default=None, help="tfds builder name, e.g. imagenet2012 (needs --manual-dir)")
    a("--manual-dir", default=None)
    a("--synthetic", action="store_true")
    a("--num-classes", type=int, default=1000, help="synthetic data only")
    a("--no-datacache", action="store_true", help="decode every epoch (no DataCache)")
    a("--global-shuffle", action="store_true",
      help="draw every rank's shard anew each epoch (default: a fixed random shard per rank, "
           "reshuffled inside each epoch; see datacache.cached_dataset)")
    a("--redis-url", default=None, help="an existing Redis (default: one embedded per node)")
    a("--cache-dir", default=None, help="DataCache level-1 directory")
    a("--target-top5", type=float, default=0.93)
    a("--log-dir", default="dawnbench_out")
    a("--ckpt-dir", default=None, help="BackupAndRestore per rank; a restarted run resumes here")
    a("--breakdown-steps", type=int, default=None,
      help="steps timed per phase at each stage end (0: off; default 3, 0 with --diloco or --elastic)")
    a("--topology", default=None)
    a("--elastic", action="store_true",
      help="under horovodrun's elastic mode (--host-discovery-script): a lost node's ranks leave, the others roll "
           "back to their last commit and go on; a node listed again joins (tf_commlib.elastic)")
    a("--commit-every", type=int, default=10, help="with --elastic: steps between commits (in memory)")
    a("--seed", type=int, default=0)
    a("--deterministic", action="store_true", help="TF op determinism (bit-reproducible resume)")
    return p


def parse(argv=None):
    p = parser()
    args = p.parse_args(argv)
    try:
        check(args)
    except ValueError as e:
        p.error(str(e))
    return args


def check(args):
    args.stage_list = parse_stages(args.stages, args.epoch_scale, MIN_RESOLUTION[args.model])
    schedule_given = args.schedule is not None
    if not schedule_given:   # DiLoCo's inner steps average dense gradients inside the node
        args.schedule = "0:dense" if args.diloco else default_schedule(args.stage_list)
    if args.breakdown_steps is None:   # DiLoCo has no per-phase breakdown; --elastic takes none
        args.breakdown_steps = 0 if args.diloco or args.elastic else 3
    args.schedule_map = parse_schedule(args.schedule)
    sources = [bool(args.data), bool(args.tfds), args.synthetic]
    if sum(sources) != 1:
        raise ValueError("give exactly one of --data DIR, --tfds NAME, --synthetic")
    if args.data:
        for sub in ("train", "val"):
            if not os.path.isdir(os.path.join(args.data, sub)):
                raise ValueError(f"--data {args.data!r}: no {sub}/ folder (ImageNet layout: train/CLASS/*.jpg, "
                                 "val/CLASS/*.jpg, or val/*.jpg with --val-labels FILE)")
        check_val(args)
    elif args.val_labels:
        raise ValueError("--val-labels labels the flat val/ folder of --data DIR: give --data")
    if args.tfds and not (args.manual_dir and os.path.isdir(args.manual_dir)):
        raise ValueError(f"--tfds needs --manual-dir DIR with the downloaded archives, got {args.manual_dir!r}")
    if not 0 < args.target_top5 <= 1:
        raise ValueError(f"--target-top5 must be in (0, 1], got {args.target_top5!r}")
    if not 0 < args.density <= 1:
        raise ValueError(f"--density must be in (0, 1], got {args.density!r}")
    if args.powersgd_rank is not None and args.powersgd_rank < 1:
        raise ValueError(f"--powersgd-rank must be >= 1, got {args.powersgd_rank!r}")
    if args.steps_per_epoch is not None and args.steps_per_epoch < 1:
        raise ValueError(f"--steps-per-epoch must be >= 1, got {args.steps_per_epoch!r}")
    if args.synthetic and args.steps_per_epoch is None:
        args.steps_per_epoch = 10
    if args.fusion_threshold_bytes is not None and args.fusion_threshold_bytes < 0:
        raise ValueError(f"--fusion-threshold-bytes must be >= 0, got {args.fusion_threshold_bytes!r}")
    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr must be positive, got {args.lr!r}")
    for name in ("warmup_epochs", "weight_decay", "label_smoothing", "momentum", "breakdown_steps"):
        if not getattr(args, name) >= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)!r}")
    if args.num_classes < 2:
        raise ValueError(f"--num-classes must be >= 2, got {args.num_classes!r}")
    if args.auto_candidates is not None and "auto" not in args.schedule_map.values():
        raise ValueError("--auto-candidates goes with a --schedule that runs auto")
    if (args.calibration_cache or args.recalibrate) and not args.calibrate:
        raise ValueError("--calibration-cache and --recalibrate go with --calibrate")
    if args.recalibrate and not (args.calibration_cache or args.ckpt_dir):
        raise ValueError("--recalibrate rewrites the calibration cache: give --calibration-cache FILE or --ckpt-dir")
    if args.commit_every < 1:
        raise ValueError(f"--commit-every must be >= 1, got {args.commit_every!r}")
    if args.elastic:
        from tf_commlib.topology import elastic_job

        if not elastic_job():
            raise ValueError("--elastic needs horovodrun's elastic mode: --host-discovery-script (with --min-np, "
                             "--max-np)")
        clashing = [flag for flag, on in (("--ckpt-dir", args.ckpt_dir), ("--topology", args.topology),
                                          ("--tfds", args.tfds), ("--breakdown-steps", args.breakdown_steps > 0),
                                          ("--calibrate", args.calibrate)) if on]
        if clashing:
            raise ValueError(f"--elastic does not go with {', '.join(clashing)}: it keeps its state in memory, takes "
                             "the layout from the live hosts and resumes an epoch on DataCache's shards (--data or "
                             "--synthetic), and times no step breakdown")
    if args.diloco != "auto" and args.diloco < 0:
        raise ValueError(f"--diloco must be >= 0 (0: off), got {args.diloco!r}")
    if args.diloco:
        clashing = [flag for flag, on in (("--shard-optimizer", args.shard_optimizer), ("--calibrate", args.calibrate),
                                          ("--breakdown-steps", args.breakdown_steps > 0)) if on]
        clashing += [flag for flag, on in (("--compression", args.compression != "none"),
                                           ("--dgc-warmup", (args.dgc_warmup or 0) > 0),
                                           ("--schedule", schedule_given and len(args.schedule_map) > 1)) if on]
        if clashing:
            raise ValueError(f"--diloco does not go with {', '.join(clashing)} (the inner steps average dense "
                             "gradients inside the node; give --breakdown-steps 0)")
    elif args.inter_compression:
        raise ValueError("--inter-compression goes with --diloco H")
    if not args.outer_lr > 0 or not 0 <= args.outer_momentum < 1:
        raise ValueError(f"--outer-lr must be > 0 and --outer-momentum in [0, 1), got {args.outer_lr!r}, "
                         f"{args.outer_momentum!r}")
    args.auto_candidates = check_algorithms(args.schedule_map, args.auto_candidates)
    if args.dgc_warmup is None:   # DistributedOptimizer's default where the schedule runs "auto"
        from tf_commlib.keras.options import AUTO_WARMUP

        args.dgc_warmup = AUTO_WARMUP if "auto" in args.schedule_map.values() and not args.diloco else 0
