// Everything zrt offers a program that links zrt::zrt: the model contract and kernels, the
// ZeRO engine, the Trainer, and the version.
#pragma once

#include "zrt/engine.h"
#include "zrt/model.h"
#include "zrt/trainer.h"
#include "zrt/version.h"
