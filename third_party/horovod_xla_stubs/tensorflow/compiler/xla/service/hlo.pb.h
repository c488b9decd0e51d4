// Empty on purpose: horovod/tensorflow/xla_mpi_ops.cc includes this header but uses it only
// under HAVE_GPU. A CPU (Gloo) build of Horovod 0.28.1 against TF 2.21 needs it to resolve.
