// Shared-memory reduce-scatter and all-gather among the ranks of one node (tf_commlib.shm).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Stateful: two calls with the same input are two collectives, never merged or pruned.
REGISTER_OP("CommlibShmReduceScatter")
    .Input("x: float")
    .Output("shard: float")
    .Attr("segment: string")
    .Attr("rank: int")
    .Attr("size: int")
    .Attr("timeout_seconds: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &x));
      int64_t size;
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      DimensionHandle shard;
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(x, 0), size, /*evenly_divisible=*/true, &shard));
      c->set_output(0, c->Vector(shard));
      return ::tensorflow::OkStatus();
    });

REGISTER_OP("CommlibShmAllgather")
    .Input("x: T")
    .Output("gathered: T")
    .Attr("T: {bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, half, bfloat16, float, double}")
    .Attr("segment: string")
    .Attr("rank: int")
    .Attr("size: int")
    .Attr("timeout_seconds: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &x));
      TF_RETURN_IF_ERROR(c->ReplaceDim(x, 0, c->UnknownDim(), &out));
      c->set_output(0, out);
      return ::tensorflow::OkStatus();
    });
