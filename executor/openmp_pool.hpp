#pragma once

namespace pipetune::exec {

/// Frees the calling thread's OpenMP thread pool, if it has one. Returns false, doing nothing,
/// unless the OpenMP runtime LibTorch loaded is GNU libgomp with omp_pause_resource_all (OpenMP
/// 5.0): LLVM's libomp pauses every thread's pool.
///
/// Why a pipeline needs it: GNU libgomp's idle pool threads spin for their next parallel region
/// only while the pools' threads in the whole process are no more than the cores. Past that
/// they sleep at once, and every parallel region then pays a futex wake-up per thread. A pool
/// the stepping thread kept from loading or profiling the model counts against the devices'
/// pools: with 2 intra-op threads on 2 cores, a small transformer's steps on one device's
/// thread took 2.5 times as long as on the thread that profiled it, and as long as the profile
/// said once that pool was gone.
bool release_openmp_pool_of_this_thread();

}  // namespace pipetune::exec
