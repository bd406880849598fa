// The part of ATen the kernels use: tensors, the factories that make their outputs (and
// constant_pad_nd, dense_linear's pad of an odd K), dtypes and TORCH_CHECK. Each kernel file includes this rather than <torch/extension.h>, which also
// brings PyTorch's C++ frontend (nn, optim, data) and pybind11: parsing it took about 25 s per
// file, most of a first start's compile. bindings.cpp alone makes the Python module (with
// <torch/python.h>) and releases the GIL around the kernels, so no kernel file needs pybind11.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
