// ST_HOST_DEVICE marks a function that CUDA kernels call too; plain C++ compilers see nothing.
#pragma once

#ifdef __CUDACC__
#define ST_HOST_DEVICE __host__ __device__
#else
#define ST_HOST_DEVICE
#endif
