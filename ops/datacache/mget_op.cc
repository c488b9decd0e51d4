// DataCache's read path: one MGET of a batch of cached samples, checked and unpacked in C++.
#include "common/checks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// values[j] = the payload of keys[j] when its value is [prefix | indices[j] | crc32 | payload]
// with the CRC32 (zlib's) of the payload and the expected length; otherwise zeros and hit[j] =
// false (present[j] says whether the key held some value: a corrupt or foreign one). With
// enabled = false, or when Redis cannot be reached or answers with an error, nothing is read:
// ok = false, every hit and present false, and error says why (a batch whose reply fails partway
// counts as a whole failure). timeout_ms bounds a command's send and its whole reply (a server
// that trickles a reply fails the batch). A batch that failed on a pooled connection, other than
// by a timeout, is retried once on a new one.
// Stateful: it reads a server.
REGISTER_OP("DatacacheMget")
    .Input("keys: string")
    .Input("indices: int64")
    .Input("password: string")
    .Input("enabled: bool")
    .Output("values: dtype")
    .Output("hit: bool")
    .Output("present: bool")
    .Output("ok: bool")
    .Output("error: string")
    .Attr("address: string")
    .Attr("username: string = ''")
    .Attr("db: int = 0")
    .Attr("timeout_ms: int = 10000")
    .Attr("connect_timeout_ms: int = 2000")
    .Attr("prefix: string")
    .Attr("dtype: {bool, uint8, int8, uint16, int16, uint32, int32, uint64, int64, half, float, double}")
    .Attr("shape: shape")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 0, 1, "DatacacheMget", "keys"));
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 1, 1, "DatacacheMget", "indices"));
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 2, 0, "DatacacheMget", "password"));
      TF_RETURN_IF_ERROR(tf_commlib::InputRank(c, 3, 0, "DatacacheMget", "enabled"));
      ::tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle sample, values;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &sample));
      const auto n = c->Dim(c->input(0), 0);
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(n), sample, &values));
      c->set_output(0, values);
      c->set_output(1, c->Vector(n));
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Scalar());
      c->set_output(4, c->Scalar());
      return ::tensorflow::OkStatus();
    });
