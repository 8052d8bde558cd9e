/*
 * A small WAV reader shared by the C examples: 24 kHz, mono or stereo (downmixed), 16-bit PCM or
 * 32-bit float, into mono float samples.
 */
#ifndef MOSHI_NATIVE_EXAMPLE_WAV_H
#define MOSHI_NATIVE_EXAMPLE_WAV_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moshi_native.h"

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* Reads a 24 kHz WAV into mono float samples; returns NULL (and prints why) when it cannot. */
static float *read_wav(const char *path, size_t *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) { fclose(f); free(buf); return NULL; }
    fclose(f);
    if (size < 12 || memcmp(buf, "RIFF", 4) || memcmp(buf + 8, "WAVE", 4)) {
        fprintf(stderr, "%s: not a WAV file\n", path); free(buf); return NULL;
    }
    uint16_t format = 0, channels = 0, bits = 0;
    uint32_t rate = 0;
    const unsigned char *data = NULL;
    uint32_t data_len = 0;
    for (long pos = 12; pos + 8 <= size;) {
        uint32_t len = rd32(buf + pos + 4);
        const unsigned char *body = buf + pos + 8;
        if (pos + 8 + (long)len > size) len = (uint32_t)(size - pos - 8);
        if (!memcmp(buf + pos, "fmt ", 4) && len >= 16) {
            format = rd16(body); channels = rd16(body + 2); rate = rd32(body + 4); bits = rd16(body + 14);
            if (format == 0xFFFE && len >= 26) format = rd16(body + 24); /* WAVE_FORMAT_EXTENSIBLE */
        } else if (!memcmp(buf + pos, "data", 4)) {
            data = body; data_len = len;
        }
        pos += 8 + (long)len + (len & 1);
    }
    int pcm16 = format == 1 && bits == 16, float32 = format == 3 && bits == 32;
    if (!data || channels == 0 || rate != MN_SAMPLE_RATE || !(pcm16 || float32)) {
        fprintf(stderr, "%s: need a 24 kHz WAV of 16-bit PCM or 32-bit float\n", path);
        free(buf); return NULL;
    }
    size_t width = bits / 8, frames = data_len / (width * channels);
    float *out = malloc((frames ? frames : 1) * sizeof(float));
    for (size_t i = 0; out && i < frames; i++) {
        float acc = 0.0f;
        for (size_t c = 0; c < channels; c++) {
            const unsigned char *s = data + (i * channels + c) * width;
            if (pcm16) acc += (float)(int16_t)rd16(s) / 32768.0f;
            else { uint32_t u = rd32(s); float x; memcpy(&x, &u, 4); acc += x; }
        }
        out[i] = acc / (float)channels;
    }
    free(buf);
    *n_out = frames;
    return out;
}

#endif
