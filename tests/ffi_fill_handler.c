/* A minimal XLA FFI handler for tests/test_benchmark_and_ffi_targets.py: fills its one float32 result
   with 7, answering XLA's metadata query first (the API version it was compiled against). */
#include <stddef.h>
#include "xla/ffi/api/c_api.h"

XLA_FFI_Error* evjax_test_fill(XLA_FFI_CallFrame* frame) {
  XLA_FFI_Extension_Base* ext = frame->extension_start;
  if (ext != NULL && ext->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata* metadata = ((XLA_FFI_Metadata_Extension*)ext)->metadata;
    metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    metadata->traits = 0;
    return NULL;
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;
  XLA_FFI_Buffer* out = (XLA_FFI_Buffer*)frame->rets.rets[0];
  size_t n = 1;
  for (int64_t i = 0; i < out->rank; ++i) n *= (size_t)out->dims[i];
  float* data = (float*)out->data;
  for (size_t i = 0; i < n; ++i) data[i] = 7.0f;
  return NULL;
}
