"""The tables of tests/test_docs.py: how each command the docs show is covered (its docstring says
what RUN, MAPPED, CI and FLAGS mean). A command a doc shows that none of them lists, and that no other
test's text runs, fails test_every_doc_command_is_covered; an entry no doc shows any more fails too.
The strings here are not read as tests that run them (test_docs skips this file)."""

DIGITS = "python -c \"from tfc_apps.digits import write_image_folder as w; w('/tmp/digits', size=32)\""
# command -> (substring its output must contain, timeout in seconds)
RUN = {
    "python -m tfc_apps.train --help": ("--algorithm", 600),
    "python -m tfc_apps.bench --help": ("topk,comm,convergence,e2e,datacache,pto", 120),
}
# command -> (test file, test or fixture that runs it)
MAPPED = {
    DIGITS: ("tests/test_dawnbench.py", "digits"),   # the fixture: write_image_folder(tmp, size=32)
    "make demo": ("tests/test_demo.py", "test_demo_runs_both_trainings_and_compares_them"),
    "horovodrun -np 4 -H localhost:4 --gloo env TF_COMMLIB_TOPOLOGY=2x2 python scripts/dawnbench_resnet50.py "
    "--data /tmp/digits --model small --stages 16:2:32,20:1:32,24:1:32,28:1:16 --schedule 0:hitopk,3:2dtar "
    "--density 0.05 --dgc-warmup 1 --optimizer lars --lr 0.2 --eeta 0.1 --warmup-epochs 1 --label-smoothing 0 "
    "--breakdown-steps 1 --deterministic --target-top5 0.9":
        ("tests/test_dawnbench.py", "uninterrupted"),
    "TF_COMMLIB_TOPOLOGY=2x2 horovodrun -np 4 -H localhost:4 --gloo python -m tfc_apps.train --algorithm hitopk "
    "--density 0.01 --selector mstopk --epochs 20 --json hitopk.json":
        ("tests/test_convergence.py", "test_hitopk_matches_dense_accuracy"),
    "python -m tfc_apps.bench tta --quick":
        ("tests/test_bench_tta.py", "test_quick_run_prints_one_table_per_bandwidth_with_monotone_time_and_medians_of_seeds"),
    "scripts/emulate_cluster.sh up 2 2 --inter-mbit 200": ("tests/test_emulated_cluster.py", "cluster"),
    "scripts/emulate_cluster.sh down": ("tests/test_emulated_cluster.py", "cluster"),
    "scripts/emulate_cluster.sh reshape --inter-mbit 50": ("tests/test_emulated_cluster.py", "test_auto_follows_a_link_that_changes_mid_run"),
    "sbatch -N1 -n4 --overcommit scripts/slurm/train.sbatch --algorithm hitopk --epochs 3 --batch-size 32 --topology 2x2":
        ("tests/test_slurm.py", "uninterrupted"),
    "sbatch -N2 --ntasks-per-node=2 scripts/slurm/train.sbatch --epochs 3":
        ("tests/test_slurm.py", "test_two_nodes_failing_rank_fails_the_job"),
    "sbatch --requeue scripts/slurm/train.sbatch --ckpt-dir $HOME/ckpt/run1":
        ("tests/test_slurm.py", "test_scancel_then_requeue_resumes"),
    "sbatch scripts/slurm/train.sbatch --algorithm hitopk --density 0.01 --epochs 20":
        ("tests/test_slurm.py", "uninterrupted"),
    "bash scripts/build_horovod.sh --dry-run /path/to/venv":
        ("tests/test_install.py", "test_build_horovod_says_what_it_builds"),
    "sbatch -N2 --ntasks-per-node=2 scripts/slurm/dawnbench.sbatch --data /data/imagenet --ckpt-dir $HOME/ckpt/dawn1":
        ("tests/test_slurm_dawnbench.py", "test_dawnbench_job_completes"),
}
CI = {
    "make test": "what .ci/run runs",
    "make install": "the first prerequisite of make test",
    '.venv/bin/pytest -m "not slow"': "make test's pytest without the tests pytest.ini marks slow",
}
FLAGS = {
    "python -m tfc_apps.bench topk": "a benchmark (minutes to hours)",
    "python -m tfc_apps.bench comm": "a benchmark (hours on 2 cores)",
    "python -m tfc_apps.bench comm --quick": "a benchmark smoke run that still calibrates every link",
    "python -m tfc_apps.bench convergence": "a benchmark: a dozen 4-rank trainings",
    "python -m tfc_apps.bench datacache": "a benchmark (6000 JPEGs, several modes, 2 runs)",
    "python -m tfc_apps.bench pto": "a benchmark: jobs at P = 1, 2, 4",
    "python -m tfc_apps.bench pto --ranks 4 --models resnet50 --repeats 7": "a benchmark: one 4-rank job (8 min)",
    "python -m tfc_apps.bench e2e": "a benchmark: ResNet-50 on 4 ranks at 3 resolutions",
    "python -m tfc_apps.bench e2e --inter-mbit 100 --resolutions 64 --configs dense_fp32 dense_fp16 dense_fp16 "
    "dense_fp16": "a benchmark: ResNet-50 on the emulated cluster (6 min)",
    "python -m tfc_apps.bench e2e --inter-mbit 100 --resolutions 64 --configs dense_fp16 hitopk@0.01 powersgd":
        "a benchmark: ResNet-50 on the emulated cluster (7 min)",
    "python -m tfc_apps.bench e2e --inter-mbit 500 --resolutions 64 --configs dense_fp16 hitopk@0.01 powersgd":
        "a benchmark: ResNet-50 on the emulated cluster (6 min)",
    "python -m tfc_apps.bench tta": "a benchmark: every configuration at four bandwidths (hours)",
    "python -m tfc_apps.bench tta --inter-mbit 5 25 --repeats 3 --configs auto diloco_h8_int4_no_overlap":
        "a benchmark: 12 four-rank trainings and 2 calibrations",
    "python -m tfc_apps.bench tta --inter-mbit 100 0 --repeats 3 --configs auto diloco_h8_int4_no_overlap dense_fp16":
        "a benchmark: 18 four-rank trainings and 2 calibrations",
    "python -m tfc_apps.bench tta --dataset patches --epochs 5 --target 0.95 --inter-mbit 5 25 --repeats 3 --configs auto "
    "diloco_h8_int4_no_overlap": "a benchmark: 12 four-rank trainings and 2 calibrations (20 min)",
    "python -m tfc_apps.bench tta --dataset patches --epochs 5 --target 0.95 --inter-mbit 100 0 --repeats 3 --configs auto "
    "diloco_h8_int4_no_overlap dense_fp16": "a benchmark: 18 four-rank trainings and 2 calibrations (28 min)",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 3 --configs dense_fp16 hitopk powersgd auto "
    "diloco_h8_int4_no_overlap": "a benchmark: 15 four-rank trainings (23 min)",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 9 --configs auto diloco_h8_int4_no_overlap":
        "a benchmark: 18 four-rank trainings (20 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 25 --configs auto diloco_h8_int4_no_overlap":
        "a benchmark: 4 four-rank trainings and 2 calibrations (6 min)",
    "python -m tfc_apps.bench tta --inter-mbit 100 0 --configs auto diloco_h8_int4_no_overlap dense_fp16":
        "a benchmark: 6 four-rank trainings and 2 calibrations (7 min)",
    "python -m tfc_apps.bench tta --inter-mbit 0 --repeats 3 --configs dense_fp16 auto":
        "a benchmark: 6 four-rank trainings (6 min)",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 3 --configs powersgd powersgd_r1 hitopk hitopk_0.001":
        "a benchmark: 12 four-rank trainings (14 min)",
    "python -m tfc_apps.bench tta --dataset patches --inter-mbit 100 --epochs 5 --target 0.95 --repeats 3 --configs "
    "dense_fp16 hitopk auto": "a benchmark: 9 four-rank trainings on the photo patches (16 min)",
    "python -m tfc_apps.cluster_launch -- python scripts/dawnbench_resnet50.py --data DIR --model small --optimizer sgd "
    "--warmup-epochs 1 --stages 32:8:8 --schedule 0:auto --auto-candidates hitopk --density 0.001 --dgc-warmup 2 "
    "--no-momentum-masking --breakdown-steps 0 --seed 0 --calibrate --calibration-cache FILE":
        "a 4-rank training on the emulated cluster (2 min); DIR and FILE are the reader's",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 3 --configs dense_fp16 hitopk powersgd auto diloco_h8_q8 "
    "diloco_auto_q8": "a benchmark: 18 four-rank trainings on the emulated cluster (49 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 --configs dense_fp16 powersgd auto diloco_h8_q8 diloco_auto_q8":
        "a benchmark: 5 four-rank trainings on the emulated cluster (25 min)",
    "python -m tfc_apps.cluster_launch -- python scripts/dawnbench_resnet50.py --synthetic --model resnet50 "
    "--stages 64:5:8 --steps-per-epoch 4 --optimizer sgd --breakdown-steps 0":
        "a benchmark: ResNet-50 on the emulated cluster (2 min per configuration)",
    "python -m tfc_apps.bench e2e --model small --resolutions 32 --configs dense_fp16 hitopk@0.01 powersgd "
    "--fusion-threshold-bytes 1048576 26214400 1048576 26214400 --steps 8 --warmup 2 --breakdown-steps 0 "
    "--inter-mbit 100": "a benchmark: the small model on the emulated cluster, 12 configurations (5 min)",
    "python -m tfc_apps.bench tta --inter-mbit 100 0 --configs dense_fp16 hitopk auto --repeats 3":
        "a benchmark: 18 four-rank trainings (46 min)",
    "python -m tfc_apps.cluster_launch -- python scripts/dawnbench_resnet50.py --synthetic --model resnet50 "
    "--stages 64:5:8 --steps-per-epoch 4 --optimizer sgd --breakdown-steps 0 --schedule 0:auto --calibrate "
    "--calibration-cache FILE": "ResNet-50 on the emulated cluster with auto's calibration (9 min); FILE is the reader's",
    "python -m tfc_apps.bench tta --inter-mbit 5 --repeats 3 --configs dense_fp16 auto":
        "a benchmark: 6 four-rank trainings on the emulated cluster, dense fp16 10 min each (35 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 --repeats 3 --configs dense_fp16 auto diloco_h8_int4_no_overlap":
        "a benchmark: 9 four-rank trainings on the emulated cluster, dense fp16 10 min each (37 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 --repeats 3 --configs auto_per_step auto_settings":
        "a benchmark: 6 four-rank trainings on the emulated cluster (10 min)",
    "python -m tfc_apps.cluster_launch -- python scripts/dawnbench_resnet50.py --data DIR --model small --optimizer sgd "
    "--warmup-epochs 1 --stages 32:8:8 --schedule 0:auto --auto-candidates hitopk:density_scale=0.1 powersgd:rank=1 "
    "--density 0.01 --selector mstopk --compression fp16 --dgc-warmup 2 --no-momentum-masking --breakdown-steps 0 "
    "--seed 0 --calibrate --calibration-cache FILE":
        "a 4-rank training on the emulated cluster (1.5 min); DIR and FILE are the reader's",
    "python -m tfc_apps.bench tta --inter-mbit 100 --repeats 3 --configs dense_fp16 hitopk auto":
        "a benchmark: 9 four-rank trainings on the emulated cluster (11 min)",
    "python -m tfc_apps.bench tta --dataset patches --inter-mbit 25 --epochs 5 --target 0.95 --repeats 3 --configs "
    "auto diloco_h8_int4_no_overlap":
        "a benchmark: 6 four-rank trainings on the second image set, on the emulated cluster (11 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 --repeats 3 --configs powersgd auto diloco_h8_q8 diloco_h8_int4":
        "a benchmark: 12 four-rank trainings on the emulated cluster (15 min)",
    "python -m tfc_apps.bench tta --dataset patches --inter-mbit 5 --epochs 5 --target 0.95 --repeats 3 --configs "
    "powersgd diloco_h8_q8 diloco_h8_int4":
        "a benchmark: 9 four-rank trainings on the second image set, on the emulated cluster (25 min)",
    "python -m tfc_apps.bench tta --dataset patches --inter-mbit 5 --epochs 5 --target 0.95 --repeats 3 --configs "
    "powersgd auto diloco_h8_int4_no_overlap":
        "a benchmark: 9 four-rank trainings on the second image set, on the emulated cluster (22 min)",
    "python -m tfc_apps.bench tta --dataset patches --inter-mbit 0 --epochs 5 --target 0.95 --repeats 3 --configs "
    "dense_fp16 auto":
        "a benchmark: 6 four-rank trainings on the second image set, on loopback (12 min)",
    "python -m tfc_apps.bench tta --inter-mbit 0 --repeats 9 --configs dense_fp16 diloco_h8_int4 "
    "diloco_h8_int4_no_overlap": "a benchmark: 27 four-rank trainings on loopback (30 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 --repeats 3 --configs powersgd diloco_h8_int4 "
    "diloco_h8_int4_no_overlap": "a benchmark: 9 four-rank trainings on the emulated cluster (12 min)",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 3 --configs dense_fp16 powersgd diloco_h8_int4 "
    "diloco_h8_int4_no_overlap": "a benchmark: 12 four-rank trainings on the emulated cluster (17 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 25 --repeats 3 --configs hitopk powersgd diloco_h8_int4_no_overlap":
        "a benchmark: 18 four-rank trainings on the emulated cluster (25 min)",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 3 --configs powersgd diloco_h8_int4 "
    "diloco_h8_int4_no_overlap": "a benchmark: 9 four-rank trainings on the emulated cluster (8 min)",
    "python -m tfc_apps.bench faults --cases lost back --runs 3":
        "a benchmark: 18 elastic four-rank trainings on two local host names (21 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 25 --repeats 3 --configs diloco_h8_int4":
        "a benchmark: 6 four-rank trainings on the emulated cluster (11 min)",
    "python -m tfc_apps.bench tta --inter-mbit 100 0 --repeats 3 --configs dense_fp16 powersgd "
    "diloco_h8_int4_no_overlap": "a benchmark: 18 four-rank trainings (23 min)",
    "python -m tfc_apps.bench tta --inter-mbit 25 --repeats 3 --configs dense_fp16":
        "a benchmark: 3 four-rank trainings on the emulated cluster (9 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 --repeats 3 --configs dense_fp16":
        "a benchmark: 3 four-rank trainings on the emulated cluster, 10 min each (31 min)",
    "python -m tfc_apps.bench tta --inter-mbit 5 25 --repeats 3 --configs powersgd auto diloco_h8_int4_no_overlap":
        "a benchmark: 18 four-rank trainings on the emulated cluster (21 min)",
    "python -m tfc_apps.bench e2e --model small --resolutions 32 --inter-mbit 100 --configs dense_fp32 dense_fp16 "
    "dense_fp16 dense_fp16 dense_fp16 dense_fp16 --fusion-threshold-bytes 1048576 --steps 6 --warmup 2 "
    "--breakdown-steps 4":
        "a benchmark: the overlap target's five repeats (4 ranks, minutes)",
    "python -m tfc_apps.bench e2e --model small --resolutions 32 --batch 32 --inter-mbit 100 --configs dense_fp32 "
    "dense_fp16 dense_fp16 dense_fp16 dense_fp16 dense_fp16 --fusion-threshold-bytes 1048576 --steps 6 --warmup 2 "
    "--breakdown-steps 4":
        "a benchmark: the same at bench tta's batch (4 ranks, minutes)",
    "python -m tfc_apps.bench e2e --model small --resolutions 32 --inter-mbit 100 --configs dense_fp32 dense_fp16 "
    "2dtar_fp16 hitopk@0.01 hitopk@0.01_no_overlap powersgd --fusion-threshold-bytes 1048576 --steps 4 --warmup 1 "
    "--breakdown-steps 3":
        "a benchmark: 6 configurations on 4 ranks of the emulated cluster (tests/test_bench_e2e.py tests its table)",
    "python -m tfc_apps.bench e2e --model small --resolutions 32 --configs dense_fp16 --fusion-threshold-bytes "
    "262144 1048576 4194304 26214400 67108864 --steps 4 --warmup 1 --breakdown-steps 3 --inter-mbit 100":
        "a benchmark: the fusion-threshold sweep behind the default (4 ranks, minutes)",
    "python -m tfc_apps.bench e2e --model small --resolutions 32 --configs dense_fp16 --fusion-threshold-bytes "
    "1048576 67108864 1048576 67108864 1048576 67108864 --steps 4 --warmup 1 --breakdown-steps 3 --inter-mbit 100":
        "a benchmark: repeats of the sweep's two leading thresholds (4 ranks, minutes)",
    "horovodrun -np 4 -H localhost:4 --gloo env TF_COMMLIB_TOPOLOGY=2x2 python scripts/dawnbench_resnet50.py "
    "--data /tmp/digits --model small --optimizer lars --lr 0.2 --eeta 0.1 --schedule 0:hitopk,4:2dtar --stages 32:8:32 --warmup-epochs 1 --breakdown-steps 0 --label-smoothing 0 --shard-optimizer":
        "a measurement: 8 epochs on 4 ranks, sharded over a node's ranks (tests/test_dawnbench.py and "
        "tests/test_zero.py run the flag across the switch)",
    "python -m tfc_apps.bench faults": "a benchmark: 2 runs of 4 faults, each with its resumed run (10-15 min); "
                                       "tests/test_faults.py runs --quick",
    "python -m datacache warm ROOT --size 224 --redis-url URL --node I/M --ranks-per-node N --seed S":
        "a template (ROOT, URL, I/M, N, S); tests/test_datacache_shards.py runs warm --node on 2x4 and 3x2",
    "python -m datacache warm ROOT/val --labels FILE --classes ROOT/train --size 224 --redis-url URL --node I/M "
    "--ranks-per-node N --seed S": "a template; tests/test_flat_folder.py warms a flat folder so",
    "python -m tfc_apps.cluster_launch --local 1 --np-per-node 4 -- python -m tfc_apps.train ...": "a template",
    "python -m tfc_apps.cluster_launch -- python -m tfc_apps.bench comm": "the comm benchmark, on every rank",
    "python -m tfc_apps.train --density adaptive [--candidates 0.1,0.01]":
        "a template; tests/test_convergence.py trains with --density adaptive",
    "python -m tfc_apps.cluster_launch -- CMD": "a template",
    "python -m tfc_apps.slurm -- CMD": "a template (what the batch scripts run)",
    "python -c \"import tensorflow as tf; print(tf.sysconfig.get_build_info().get('cuda_version'))\"":
        "prints the CUDA version of a CUDA TensorFlow (None on this CPU build); one more TensorFlow import",
    "python3 scripts/cuda_harness/run_harness.py --json": "needs a GPU with CuPy and nvcc",
    "make cuda-check": "needs nvcc (test_make_cuda_check runs it where nvcc is)",
    "TF_COMMLIB_TOPOLOGY=2x2 horovodrun -np 4 -H localhost:4 --gloo python scripts/dawnbench_resnet50.py --synthetic "
    "--stages 32:1:4,40:1:4 --steps-per-epoch 3 --schedule 0:hitopk,1:2dtar --optimizer lars":
        "a measurement: synthetic ResNet-50 on 4 ranks (4 min); tests/test_dawnbench.py runs the script's breakdown",
    "horovodrun -np 16 -H host1:8,host2:8 --gloo --network-interface eth0 python -m tfc_apps.train --algorithm hitopk":
        "needs two real hosts reachable by ssh",
    "sbatch -N2 --ntasks-per-node=4 --gpus-per-task=1 scripts/slurm/train.sbatch --algorithm hitopk --density 0.01":
        "needs two GPU nodes under Slurm (tests/test_slurm.py runs train.sbatch on two CPU nodes)",
    "horovodrun -np 16 -H host1:8,host2:8 --gloo python -m tfc_apps.bench comm --quick":
        "needs two real hosts reachable by ssh",
}
# Extra sources whose add_argument calls belong to a program's parser.
