// Functor shared by the CPU and CUDA kernels of CommlibScatterAdd.
#ifndef TF_COMMLIB_OPS_SCATTER_ADD_SCATTER_ADD_H_
#define TF_COMMLIB_OPS_SCATTER_ADD_SCATTER_ADD_H_

#include <cstdint>

namespace tf_commlib {

template <typename Device, typename T, typename Tidx>
struct ScatterAddFunctor {
  // dense[0:size] = 0; dense[indices[i]] += values[i] for i < n. Indices are already validated.
  void operator()(const Device& d, const Tidx* indices, const T* values, int64_t n, T* dense,
                  int64_t size);
};

}  // namespace tf_commlib

#endif  // TF_COMMLIB_OPS_SCATTER_ADD_SCATTER_ADD_H_
