// CommlibScatterAdd: dense[size] with values summed at their indices (repeats add up).
#include "common/checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

REGISTER_OP("CommlibScatterAdd")
    .Input("indices: Tidx")
    .Input("values: T")
    .Input("size: int64")
    .Output("dense: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 0, 1, "scatter_add", "indices"));
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 1, 1, "scatter_add", "values"));
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 2, 0, "scatter_add", "size"));
      ::tensorflow::shape_inference::DimensionHandle size;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &size));
      c->set_output(0, c->Vector(size));
      return ::tensorflow::OkStatus();
    });
