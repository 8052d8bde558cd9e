/*
 * The error check shared by the C examples: CHECK(call) runs a moshi-native call and, when it fails
 * (a negative MnStatus), prints the call, its status and mn_last_error() and returns 1 from main.
 */
#ifndef MOSHI_NATIVE_EXAMPLE_CHECK_H
#define MOSHI_NATIVE_EXAMPLE_CHECK_H

#include <stdio.h>

#include "moshi_native.h"

#define CHECK(call)                                                                      \
    do {                                                                                 \
        MnStatus st_ = (call);                                                           \
        if (st_ < 0) {                                                                   \
            fprintf(stderr, "%s failed (%d): %s\n", #call, (int)st_, mn_last_error());   \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

#endif
