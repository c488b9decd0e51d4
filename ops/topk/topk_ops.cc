// Registrations of the top-k selector ops. x of any shape is read as a flat vector. Every shape
// function checks the ranks of the other inputs and names the argument (ops/common/checks.h).
#include "common/checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using ::tensorflow::shape_inference::InferenceContext;
using tf_commlib::InputRank;

// values and indices: vectors of a length known only at run time.
static void SelectionOutputs(InferenceContext* c) {
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(c->UnknownDim()));
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
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 1, 0, "mstopk", "k"));
      TF_RETURN_IF_ERROR(InputRank(c, 2, 0, "mstopk", "seed"));
      SelectionOutputs(c);
      c->set_output(2, c->Vector(4));
      c->set_output(3, c->Vector(4));
      return ::tensorflow::OkStatus();
    });

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
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 1, 0, "threshold_search", "k"));
      SelectionOutputs(c);
      c->set_output(2, c->Scalar());
      return ::tensorflow::OkStatus();
    });

// Every entry with |x| >= threshold, in index order.
REGISTER_OP("CommlibThresholdSelect")
    .Input("x: T")
    .Input("threshold: double")
    .Output("values: T")
    .Output("indices: Tidx")
    .Attr("T: {float, half, bfloat16}")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .Attr("allow_nan: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 1, 0, "threshold_select", "threshold"));
      SelectionOutputs(c);
      return ::tensorflow::OkStatus();
    });

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
      TF_RETURN_IF_ERROR(InputRank(c, 1, 1, "ratio_counts", "ratios"));
      c->set_output(0, c->Vector(2));
      c->set_output(1, c->input(1));
      return ::tensorflow::OkStatus();
    });

// The input checks of the selectors written with TensorFlow ops (exact_topk, dgc_topk,
// trimmed_topk, randomk, qrgc), in the graph: k a positive scalar (at most 1 for a scalar x),
// no NaN in x unless allow_nan. n = min(k, number of entries of x).
REGISTER_OP("CommlibCheckSelection")
    .Input("x: T")
    .Input("k: int64")
    .Output("n: int64")
    .Attr("T: {float, half, bfloat16}")
    .Attr("op_name: string")
    .Attr("allow_nan: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      std::string op;
      TF_RETURN_IF_ERROR(c->GetAttr("op_name", &op));
      TF_RETURN_IF_ERROR(InputRank(c, 1, 0, op.c_str(), "k"));
      c->set_output(0, c->Scalar());
      return ::tensorflow::OkStatus();
    });
