// Registrations of the top-k selector ops. x of any shape is read as a flat vector.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

static ::tensorflow::Status SelectionShapes(InferenceContext* c) {
  ShapeHandle unused;
  for (int i = 1; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(c->UnknownDim()));
  for (int i = 2; i < c->num_outputs(); ++i) c->set_output(i, c->UnknownShapeOfRank(1));
  return ::tensorflow::OkStatus();
}

// MSTopK, shi2021 Alg. 1. thresholds = [thres1, thres2, mean, u];
// counts = [k1 (entries >= thres1), k2 (entries >= thres2), band start, number of +-Inf].
REGISTER_OP("CommlibMstopk")
    .Input("x: T")
    .Input("k: int64")
    .Input("seed: int64")  // < 0: a fresh random seed per call
    .Output("values: T")
    .Output("indices: Tidx")
    .Output("thresholds: double")
    .Output("counts: int64")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .Attr("num_samplings: int = 30")
    .Attr("allow_nan: bool = false")
    .SetShapeFn(SelectionShapes);

// RedSync Alg. 3 (corrected): binary search on the ratio until k <= count < 2k.
REGISTER_OP("CommlibThresholdSearch")
    .Input("x: T")
    .Input("k: int64")
    .Output("values: T")
    .Output("indices: Tidx")
    .Output("threshold: double")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .Attr("allow_nan: bool = false")
    .SetShapeFn(SelectionShapes);

// Every entry with |x| >= threshold, in index order.
REGISTER_OP("CommlibThresholdSelect")
    .Input("x: T")
    .Input("threshold: double")
    .Output("values: T")
    .Output("indices: Tidx")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .Attr("allow_nan: bool = false")
    .SetShapeFn(SelectionShapes);

// [mean, max] of the finite |x| (mean in the fixed order of mstopk.h), and
// counts[j] = number of entries with |x| >= mean + ratios[j] * (max - mean).
REGISTER_OP("CommlibRatioCounts")
    .Input("x: T")
    .Input("ratios: double")
    .Output("stats: double")
    .Output("counts: int64")
    .Attr("T: {float, half, bfloat16}")
    .Attr("allow_nan: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      c->set_output(0, c->Vector(2));
      c->set_output(1, c->input(1));
      return ::tensorflow::OkStatus();
    });
