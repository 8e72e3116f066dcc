// zrt's ZeRO engine (stages 0-3, offload, mixed precision) over a zrt::Model's parameters, and
// the seams it runs on: devices and streams, process groups, the MPI runtime.
#pragma once

#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/process_group.h"
#include "runtime/device/device.h"
#include "runtime/engine/zero_engine.h"
#include "zrt/model.h"
