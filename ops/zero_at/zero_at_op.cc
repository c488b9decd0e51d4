// CommlibZeroAt: sets a resource variable to 0 at flat indices, in place (DGC's momentum masking).
#include "common/checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

REGISTER_OP("CommlibZeroAt")
    .Input("resource: resource")
    .Input("indices: Tidx")
    .Attr("dtype: {float, double, half, bfloat16}")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      return tf_commlib::InputRank(c, 1, 1, "zero_at", "indices");
    });
