// CommlibScatterAdd: dense[size] with values summed at their indices (repeats add up).
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
      ::tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      ::tensorflow::shape_inference::DimensionHandle size;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &size));
      c->set_output(0, c->Vector(size));
      return ::tensorflow::OkStatus();
    });
