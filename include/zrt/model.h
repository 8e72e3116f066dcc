// zrt's model contract: what a model is to the engine (zrt::Model, ParamSpec, ParamAccess,
// TokenBatch; runtime/model_interface.h documents the acquire/release order) and the kernels a
// model's forward and backward are written with (zrt::kernels, on a KernelContext's stream).
#pragma once

#include "kernels/kernel_context.h"
#include "kernels/ops.h"
#include "models/model_registry.h"
#include "runtime/common/error.h"
#include "runtime/device/buffer.h"
#include "runtime/device/device.h"
#include "runtime/model_interface.h"
