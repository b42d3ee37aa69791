#pragma once
#include "device/device_radix_sort.cuh"
