/* test_store_fixture.h — the small native model the expert-store tests build by hand: NL layers (1 and 2 MoE),
 * NE experts of bf16 gate / up / down parts ([I, H], [I, H], [H, I]: 5120 bytes each, EXTENT bytes an expert,
 * STRIDE apart in a pack). Each test writes its own packs (striping, byte patterns) and fills the layers. */
#ifndef DF_TEST_STORE_FIXTURE_H
#define DF_TEST_STORE_FIXTURE_H
#include "model/native.h"

#include <stdio.h>

enum { NL = 3, NE = 8, H = 64, I = 40 };
#define STRIDE 16384u
#define EXTENT 15360u

/* n's model description (dir, name, config, the three parts, 2 MoE layers in layers[2]); the layers' files,
 * checksums and stripes are the caller's. */
static inline void fixture_native_init(df_native *n, native_expert_layer *layers, const char *dir, const char *name) {
    snprintf(n->dir, sizeof n->dir, "%s", dir);
    snprintf(n->name, sizeof n->name, "%s", name);
    n->cfg.num_hidden_layers = NL;
    n->cfg.num_experts_per_tok = 2;
    n->cfg.n_routed_experts = NE;
    n->cfg.hidden_size = H;
    n->cfg.moe_intermediate_size = I;
    n->expert_type = DF_W_BF16;
    n->n_experts = NE;
    n->extent_bytes = EXTENT;
    n->stride = STRIDE;
    const char *pn[3] = {"gate", "up", "down"};
    for (int p = 0; p < 3; p++) {
        snprintf(n->parts[p].name, sizeof n->parts[p].name, "%s", pn[p]);
        n->parts[p].rows = p == 2 ? H : I;
        n->parts[p].cols = p == 2 ? I : H;
        n->parts[p].offset = (uint64_t)p * 5120;
        n->parts[p].bytes = 5120;
    }
    n->n_moe_layers = 2;
    n->moe_layers = layers;
}

#endif
