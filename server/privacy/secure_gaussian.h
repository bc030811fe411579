#ifndef FEDLEARN_SERVER_PRIVACY_SECURE_GAUSSIAN_H_
#define FEDLEARN_SERVER_PRIVACY_SECURE_GAUSSIAN_H_

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace fedlearn {

// Adds N(0, stddev^2) noise to every value of `values`, drawn from OpenSSL's
// private DRBG (RAND_priv_bytes: AES-256 CTR-DRBG, seeded and reseeded from
// the operating system's getrandom), never from a seed of ours: privacy noise
// that can be replayed is no noise, so no draw is reproducible or saved.
// Box-Muller on 53-bit uniforms, 16 random bytes per pair of values.
// Thread-safe (OpenSSL keeps a DRBG per thread). Memory: a 64 KiB block of
// random bytes. INTERNAL if the generator fails (it then has no entropy);
// `values` may then be partly noised and must be discarded.
//
// Known limit: floating-point Gaussian samples leak through their low bits
// in theory (Mironov 2012 showed it for the Laplace mechanism); a discrete
// Gaussian (Canonne et al. 2020) closes it and is not built.
absl::Status AddSecureGaussianNoise(double stddev, absl::Span<double> values);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_PRIVACY_SECURE_GAUSSIAN_H_
