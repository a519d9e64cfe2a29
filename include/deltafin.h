/*
 * deltafin.h — the public C API of deltafin, an exact inference engine for
 * Mixture-of-Experts language models whose routed experts are streamed from disk.
 *
 * Everything the CLI and the server do goes through this header; neither sees
 * tensors. Conventions:
 *   - fallible calls return 0 (DF_OK) or a negative DF_E* code and, when `err`
 *     is non-NULL, write a one-line message (naming file / field / value and what
 *     to do) into err[0..errlen-1];
 *   - objects are opaque; each *_new / *_open has a matching *_free / *_close;
 *   - token ids are int32_t; logits are float32 over the model's vocabulary.
 */
#ifndef DELTAFIN_H
#define DELTAFIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DELTAFIN_VERSION "0.1.0"

enum {
    DF_OK = 0,
    DF_EINVAL = -1,       /* bad argument or option value */
    DF_EIO = -2,          /* cannot open / read / write a file */
    DF_EFORMAT = -3,      /* malformed, truncated or corrupt file (checksum mismatch included) */
    DF_EUNSUPPORTED = -4, /* valid input we cannot run (model type, tensor encoding, ...) */
    DF_ENOMEM = -5,       /* allocation failed */
    DF_EBUDGET = -6,      /* --ram-budget too small; the message says the minimum */
    DF_ECANCELLED = -7,   /* a progress callback asked to stop */
    DF_ECONTEXT = -8      /* context (KV cache) full */
};

/* Progress callback for long work (convert, prefill, verify). `done` of `total`
 * units (bytes or tokens; `what` names them). Return non-zero to cancel. */
typedef int (*df_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);

/* ------------------------------------------------------------------ convert */

typedef enum {
    DF_SPINE_SOURCE = 0, /* keep every spine tensor in its checkpoint encoding (exact) */
    DF_SPINE_BF16 = 1,   /* re-encode f32/f16/fp8 spine tensors as bf16 (exact only if lossless; reported) */
    DF_SPINE_INT8 = 2    /* per-row absmax int8 (NOT exact; labeled wherever results are printed) */
} df_spine_mode;

typedef struct {
    df_spine_mode spine;        /* default DF_SPINE_SOURCE */
    const char *expert_dirs;    /* comma-separated directories to stripe expert packs over; NULL = out_dir */
    int threads;                /* 0 = all cores */
    df_progress_fn progress;    /* may be NULL */
    void *progress_user;
    const char *stripe_weights; /* with expert_dirs: comma-separated relative speed per directory
                                   (e.g. GB/s); stripe k's size is proportional to it. NULL = equal */
    /* appended (streamed installs): 1 = a routed expert whose extent is all zero bytes (a tensor the sparse
     * checkpoint of `setup --stream` does not hold yet) is not written: the pack keeps a hole there */
    int sparse_experts;
} df_convert_opts;

void df_convert_opts_default(df_convert_opts *o);

/* Convert a Hugging Face checkpoint directory (config.json + *.safetensors)
 * into deltafin's native layout in out_dir (docs/native-format.md). Writes to a
 * temporary name and renames at the end: an interrupted conversion leaves no
 * manifest that looks complete. */
int df_convert(const char *hf_dir, const char *out_dir, const df_convert_opts *opts,
               char *err, size_t errlen);

/* -------------------------------------------------------------------- model */

typedef struct df_model df_model;
typedef struct df_tokenizer df_tokenizer;

typedef struct {
    int threads;                /* compute threads; 0 = all cores */
    uint64_t ram_budget;        /* bytes for all weights + KV cache; 0 = unlimited */
    const char *expert_dirs;    /* override where expert packs live (comma-separated); NULL = manifest's */
    const char *cache_dir;      /* where an HF directory is converted on first open; NULL = $XDG_CACHE_HOME/deltafin */
    df_spine_mode spine;        /* used when `path` is an HF directory that must be converted */
    const char *events_path;    /* JSONL per-token I/O events; NULL = off */
    const char *backend;        /* "cpu" (default), "cpu-scalar" (reference kernels), "cuda", "auto" (cuda when a
                                   CUDA device is present); NULL = env DF_BACKEND if set, else "cpu" */
    df_progress_fn progress;    /* conversion / load progress; may be NULL */
    void *progress_user;
    /* added by the engine (append-only): */
    int kv_positions;           /* with ram_budget: KV-cache positions reserved inside the budget, and the
                                   most a session may hold; 0 = min(4096, max_position_embeddings); more than
                                   max_position_embeddings: that maximum */
    int prefetch;               /* router lookahead prefetch: 0 = auto (on with a ram_budget; without one, a
                                   prompt's next layer only), 1 = on (for decode, kept only while timed decode
                                   steps show it faster than off: a live A/B gate), 2 = off, 3 = ungated (always on). Alias: env DF_PREFETCH=1|on|0|off|ungated when this is 0.
                                   Never changes results. */
    const char *heat_path;      /* persistent expert heat histogram: NULL = <native model dir>/heat.bin when a
                                   ram_budget is set; "off" = none. Learned across runs; never changes results. */
    int n_seq;                  /* with ram_budget: sessions whose KV caches (kv_positions each) the budget
                                   reserves, e.g. serve --parallel; 0 = 1 */
    /* streamed installs (`deltafin setup --stream`): where routed experts not yet on local disk come from:
     * a `store_remote` (src/store/store.h), e.g. stream_remote() of src/hub/stream.h; NULL = all local.
     * Changes where bytes come from, never results. */
    const void *remote_source;
    /* the CUDA backend (docs/cuda.md): */
    uint64_t gpu_budget;        /* backend cuda: GPU memory for the routed-expert cache (the first expert tier);
                                   0 = all free GPU memory less 1 GiB. The spine is cached beside it. */
    int prefault;               /* with ram_budget: fault the expert cache's slot buffers in (huge pages, two
                                   threads started at open) before their first read: 0 = auto (on), 1 = on, 2 = off.
                                   Alias: env DF_PREFAULT=1|0 when this is 0. Never changes results. */
    int io_depth;               /* expert reads in flight per drive (1..1024); 0 = 16. Never changes results. */
    uint64_t io_size;           /* bytes of one expert read request (a multiple of 4096, 4 KiB..64 MiB); 0 = 1 MiB.
                                   Never changes results. */
} df_model_opts;

void df_model_opts_default(df_model_opts *o);

/* Open a model: `path` is a native model directory (has manifest.json) or a
 * Hugging Face checkpoint directory (has config.json), which is converted once
 * into opts->cache_dir and reused. */
int df_model_open(df_model **out, const char *path, const df_model_opts *opts,
                  char *err, size_t errlen);
void df_model_close(df_model *m);

/* One line describing the resolved configuration (model, layers, experts,
 * encodings, threads, backend, budget, I/O engine). Owned by the model. */
const char *df_model_describe(const df_model *m);
/* Model name for APIs (the directory's basename unless the manifest names it). */
const char *df_model_name(const df_model *m);
int df_model_n_vocab(const df_model *m);
int df_model_n_ctx_max(const df_model *m);
/* 1 when every weight is used exactly as the checkpoint defines it; 0 for lossy modes (int8 spine). */
int df_model_is_exact(const df_model *m);
/* The model's tokenizer, or NULL when its directory has none. Owned by the model. */
const df_tokenizer *df_model_tokenizer(const df_model *m);
/* When the model directory has a tokenizer file that could not be opened: the reason
 * (df_model_tokenizer then returns NULL). NULL when there is no such error. Owned by the model. */
const char *df_model_tokenizer_error(const df_model *m);
/* The architecture of a checkpoint or native model directory (its config.json) in one line, e.g.
 * "kimi_k3: 93 layers (69 KDA, 24 MLA), 1 dense + 92 MoE, 896 experts top-16, latent MoE 3584, ...".
 * DF_EIO (no/unreadable config.json), DF_EFORMAT / DF_EUNSUPPORTED (the config's problem, named). */
int df_checkpoint_describe(const char *path, char *buf, size_t cap, char *err, size_t errlen);
/* Verify every checksum of the native layout (deltafin doctor). */
int df_model_verify(df_model *m, df_progress_fn progress, void *user, char *err, size_t errlen);
/* Verify every checksum without stopping at the first bad one, and without loading the model
 * (deltafin doctor; added for issue 11 item 14): spine.bin and each routed expert are read once,
 * and every problem found (a checksum mismatch or a read error) goes to `report` (may be NULL)
 * while the check goes on. `path` is a native model directory, or a Hugging Face directory
 * converted into opts->cache_dir as df_model_open does (opts may be NULL; only cache_dir, spine,
 * expert_dirs, progress and progress_user are used; progress gets "bytes"). A corrupt spine.bin
 * does not stop the expert check. Returns the number of problems (0: every checksum matches;
 * otherwise err summarises them, naming the first ones), or a negative DF_E* when the model's
 * files cannot be checked at all (manifest unreadable, a pack missing or truncated: err says which). */
typedef struct {
    int layer, expert;          /* the routed expert; -1, -1 for spine.bin */
    const char *file;           /* the file it is in (a striped expert: its first stripe's file) */
    uint64_t offset, bytes;     /* where in that file (a striped expert: its first stripe) */
    const char *message;        /* one line: every file and offset, the XXH64 found and the manifest's */
} df_verify_problem;
typedef struct {
    int spine_ok;               /* 1: spine.bin matches its checksum */
    uint64_t spine_bytes;
    char spine_file[1100];
    int n_moe_layers;
    int n_experts;              /* routed experts checked (all MoE layers) */
    int n_bad_experts;          /* of them, corrupt or unreadable */
    int n_unreadable_experts;   /* of those, the ones in a layer whose pack could not be opened (none of them read) */
} df_verify_summary;
typedef void (*df_verify_report_fn)(void *user, const df_verify_problem *problem);
int df_model_verify_all(const char *path, const df_model_opts *opts, df_verify_report_fn report, void *user,
                        df_verify_summary *summary, char *err, size_t errlen);

/* ---------------------------------------------------------------- tokenizer */

/* Open a tokenizer: a model directory, a tokenizer.json, or a tiktoken rank
 * file. config_path (tokenizer_config.json) may be NULL: it is then looked up
 * beside `path`; a tiktoken file without a config is taken as Kimi's. */
int df_tokenizer_open(df_tokenizer **out, const char *path, const char *config_path,
                      char *err, size_t errlen);
void df_tokenizer_free(df_tokenizer *t);

enum {
    DF_TOK_ADD_BOS = 1,        /* prepend the BOS token if the tokenizer defines one */
    DF_TOK_PARSE_SPECIAL = 2,  /* recognise special-token strings in the text as specials */
    DF_TOK_ADD_SPECIAL = 4     /* add what tokenizer_config.json asks for (add_bos_token; absent = no BOS),
                                  as transformers' add_special_tokens=True does */
};

/* Encode UTF-8 text. *ids_out is malloc'd (caller frees), *n_out its length. */
int df_tokenize(const df_tokenizer *t, const char *text, size_t len, int flags,
                int32_t **ids_out, size_t *n_out, char *err, size_t errlen);
/* Decode ids to bytes (malloc'd, NUL-terminated; *len_out excludes the NUL). */
int df_detokenize(const df_tokenizer *t, const int32_t *ids, size_t n,
                  char **text_out, size_t *len_out, char *err, size_t errlen);
int df_tokenizer_n_vocab(const df_tokenizer *t);
/* The raw bytes of one token (not UTF-8 sanitized: a token may hold part of a character), owned by the
 * tokenizer. DF_EINVAL for an id outside the vocabulary. */
int df_token_bytes(const df_tokenizer *t, int32_t id, const char **bytes, size_t *len);
/* Id of a token string (special or not), or -1. */
int32_t df_tokenizer_token_id(const df_tokenizer *t, const char *token);
/* Token ids that end a chat turn (eos, <|im_end|>, ...). Returns the count written (<= cap). */
int df_tokenizer_stop_ids(const df_tokenizer *t, int32_t *ids, int cap);

/* Streaming decoder: push ids, get only complete UTF-8 characters out. */
typedef struct df_detok df_detok;
df_detok *df_detok_new(const df_tokenizer *t);
/* Appends the text of `id` that is now complete to out (cap bytes); returns bytes written, or <0. */
int df_detok_push(df_detok *d, int32_t id, char *out, size_t cap);
/* Emits whatever is held (invalid trailing bytes become U+FFFD); returns bytes written. */
int df_detok_flush(df_detok *d, char *out, size_t cap);
void df_detok_free(df_detok *d);

enum {
    DF_CHAT_ADD_GENERATION_PROMPT = 1,
    /* Thinking switches. Neither set = the template's own default, as transformers' apply_chat_template without
     * enable_thinking (Qwen3: thinking on). DF_CHAT_THINKING passes enable_thinking=True / thinking=True /
     * reasoning_effort="high"; DF_CHAT_NO_THINKING passes enable_thinking=False / thinking=False. Formats
     * without such a switch ignore them; both at once is DF_EINVAL. */
    DF_CHAT_THINKING = 2,
    DF_CHAT_NO_THINKING = 4
};
/* Render an OpenAI-style message list (JSON array of {role, content, ...}) and
 * optional tool declarations (JSON array or NULL) in the model's chat format.
 * *text_out is malloc'd. */
int df_chat_render(const df_tokenizer *t, const char *messages_json, const char *tools_json,
                   int flags, char **text_out, char *err, size_t errlen);

/* ------------------------------------------------------------------ session */

typedef struct df_session df_session;

/* A session owns one KV cache of n_ctx positions (0 = model's default). */
int df_session_new(df_session **out, df_model *m, int n_ctx, char *err, size_t errlen);
void df_session_free(df_session *s);
int df_session_n_past(const df_session *s);
/* The tokens currently in the KV cache (n_past of them). */
const int32_t *df_session_tokens(const df_session *s);
/* Forget positions >= n_keep (prefix reuse). */
int df_session_truncate(df_session *s, int n_keep);

enum {
    DF_EVAL_ALL_LOGITS = 1  /* logits for every evaluated position, not only the last */
};

/* Append n tokens to the session and run the forward pass over them as one
 * batch (rows grouped by expert: each expert is read once per layer per call).
 * logits (may be NULL): n_vocab floats for the last position, or n*n_vocab
 * with DF_EVAL_ALL_LOGITS. progress (may be NULL) is called with ("layers", finished, all) after each layer
 * and, with the same count, from inside a long layer (between attention chunks of 256 rows and between chunks of
 * experts); a nonzero return stops the call there: DF_ECANCELLED, the session as before the call. */
int df_eval(df_session *s, const int32_t *ids, int n, float *logits, int flags,
            df_progress_fn progress, void *user, char *err, size_t errlen);

/* Called with each token df_decode_greedy chooses; nonzero stops there (that token is chosen, not evaluated). */
typedef int (*df_token_fn)(void *user, int32_t id);

/* Greedy decoding of up to n tokens: evaluates `id` (chosen but not yet in the session), picks the argmax of its
 * logits (df_sample's greedy rule: ties -> lowest id) and gives it to on_token, then evaluates that token, and so on:
 * the same tokens, session state and errors as n rounds of df_eval(s, &id, 1, ...) and df_sample(NULL, ...), each
 * stopping the loop when on_token returns nonzero. *n_out (may be NULL): the tokens given to on_token. On the GPU
 * (a model whose spine runs there, MLA layers) each step's token is chosen on the device and the next step is
 * queued before it is read back, so the device does not wait for the host between tokens; elsewhere it is that
 * loop. on_token runs with the model's evaluation lock held: it must not evaluate on this model. DF_ECONTEXT when
 * the next evaluation would overflow the session (after the tokens before it were given), and df_eval's errors. */
int df_decode_greedy(df_session *s, int32_t id, int n, df_token_fn on_token, void *user, int *n_out, char *err,
                     size_t errlen);

/* ----------------------------------------------------------------- sampling */

typedef struct {
    float temperature;   /* 0 = greedy (argmax; ties -> lowest id) */
    float top_p;         /* 1 = off */
    int top_k;           /* 0 = off */
    uint64_t seed;
} df_sampler_opts;

typedef struct df_sampler df_sampler;
void df_sampler_opts_default(df_sampler_opts *o);
df_sampler *df_sampler_new(const df_sampler_opts *o);
void df_sampler_free(df_sampler *s);
int32_t df_sample(df_sampler *s, const float *logits, int n_vocab);
/* log-softmax of logits at `id`; also the top_n (id, logprob) pairs, best first. */
float df_logprob(const float *logits, int n_vocab, int32_t id, int top_n,
                 int32_t *top_ids, float *top_logprobs);

/* -------------------------------------------------------------------- stats */

typedef struct {
    double ttft_s;                 /* first df_eval call's wall time since stats reset */
    double prefill_s, decode_s;    /* wall time in multi-token / single-token evals */
    uint64_t prefill_tokens, decode_tokens;
    uint64_t weight_bytes_read;    /* all weight bytes touched by compute (spine + experts) */
    uint64_t expert_bytes_demand;  /* bytes read from disk on demand */
    uint64_t expert_bytes_prefetch;/* bytes read from disk by prefetch */
    uint64_t expert_hits, expert_misses;
    uint64_t prefetch_useful, prefetch_issued;
    double io_stall_s;             /* compute time spent waiting for expert reads */
    uint64_t resident_bytes;       /* spine + cache + staging + KV */
    /* appended: per-drive I/O (one entry per expert directory / queue) */
    int n_drives;
    uint64_t drive_bytes[16];      /* bytes read from each drive */
    double drive_busy_s[16];       /* seconds with a read in flight; GB/s = bytes / busy */
    /* appended: wall time per phase of the forward pass (df_phase_name), summed over evals */
    double phase_s[16];
    /* appended: the union of routed experts used since the reset (each counted once), in extent bytes;
     * prefill read amplification = (expert_bytes_demand + expert_bytes_prefetch) / expert_union_bytes */
    uint64_t expert_union_bytes;
    uint64_t expert_union_count;
    /* appended: spine bytes read from disk by spine streaming (layers that do not fit the budget) */
    uint64_t spine_bytes_streamed;
    /* appended: expert cache slots page-locked for the GPU's DMA (backend cuda), of the slots allocated */
    int expert_slots_pinned, expert_slots;
    /* appended: decode steps run with the router lookahead on / off (its live A/B gate, --prefetch) */
    uint64_t prefetch_steps_on, prefetch_steps_off;
    /* appended: the router's picks (rows x top-k, summed over MoE layer evaluations) and the distinct experts those
     * picks named in each evaluation (summed): routed_picks / routed_union = rows served per expert read (1 for one
     * token; up to rows x top-k / experts for a batch whose rows route alike) */
    uint64_t routed_picks, routed_union;
} df_stats;

/* Phases of the forward pass timed in df_stats.phase_s (`run --stats --profile`). */
enum {
    DF_PHASE_EMBED = 0,      /* token embedding lookup */
    DF_PHASE_NORM,           /* RMSNorms, residual adds, AttnRes mixes */
    DF_PHASE_MLA,            /* MLA attention (projections, scores, latent cache) */
    DF_PHASE_KDA,            /* Kimi Delta Attention: conv, recurrence, gated norm (a layer in one GPU call: all) */
    DF_PHASE_ROUTER,         /* router matmul + top-k */
    DF_PHASE_EXPERTS,        /* routed + shared expert compute (latent projections included), I/O wait excluded */
    DF_PHASE_DENSE,          /* dense MLP layers */
    DF_PHASE_IO_WAIT,        /* waiting for expert reads or streamed spine layers */
    DF_PHASE_PREFETCH,       /* router lookahead for the next layer's prefetch */
    DF_PHASE_LM_HEAD,        /* final norm + lm_head */
    DF_PHASE_KDA_PROJ,       /* Kimi Delta Attention's projections and o_proj, when not in one GPU call */
    DF_PHASES
};
/* "embed", "norm+residual", "mla", "kda", "router", "experts", "dense-mlp", "io-wait", "prefetch", "lm-head". */
const char *df_phase_name(int phase);

/* The model's counters since open or the last reset. Never waits for a forward pass running on another thread:
 * the expert store's counters (hits, misses, bytes read, prefetch, drives) are live; the others are those of the
 * last finished df_eval / df_eval_batch / df_model_preload. Thread-safe. */
void df_model_stats(const df_model *m, df_stats *out);
void df_model_stats_reset(df_model *m);

/* Live view of the routed experts' tiers (what `serve`'s /store.json and web page show). For MoE layer i (0 ..
 * *moe_layers - 1, in model order; layer_ids[i], optional, receives its index among all layers) and expert e:
 * state[i * *experts + e] = 0 on the drives only, 1 being read, 2 in the host's expert cache, plus 4 when a copy is
 * in GPU memory (backend cuda); heat (optional, same shape) = the store's eviction score (recency-weighted use
 * count plus the heat tier: higher stays longer). state NULL: only the shape is returned. Returns the entries
 * (*moe_layers x *experts), or -1 for a model without routed experts or a cap below that. Safe while other threads
 * evaluate (it reads the store under its lock); no side effect. */
int df_model_expert_map(const df_model *m, unsigned char *state, float *heat, int cap, int *moe_layers,
                        int *experts, int *layer_ids);

/* What df_model_preload placed: routed experts of every MoE layer (total), those in GPU memory (backend cuda, up to
 * --gpu-budget), those in the host expert cache only (up to the RAM budget's slots; all of them without a budget);
 * the expert bytes read and the wall time. complete = 1 when every expert is in memory. */
typedef struct {
    int experts_total, on_device, in_host, complete;
    uint64_t bytes_read;
    double seconds;
} df_preload_info;
/* Read every routed expert into memory now, so decoding has no first-use reads (`run` / `serve` / `bench decode`
 * --preload): layer by layer at the drive's speed, into GPU memory first with the cuda backend, then the host cache;
 * nothing is evicted to make room (it stops when both are full). progress: what = "preload", experts placed of the
 * total; non-zero cancels (DF_ECANCELLED). info may be NULL. Errors: DF_EIO / DF_EFORMAT (a read or a checksum, the
 * file named), DF_EIO (a copy into GPU memory). Never changes results. */
int df_model_preload(df_model *m, df_progress_fn progress, void *user, df_preload_info *info, char *err, size_t errlen);
/* One line (no newline) saying where df_model_preload put the experts, e.g. "preload: 448 of 448 routed experts in
 * memory (448 in GPU memory, 0 in the host cache), 10.48 GB read in 6.5 s (1.61 GB/s)"; returns out. */
const char *df_preload_describe(const df_preload_info *info, char *out, size_t cap);

/* ------------------------------------------------------------ batched eval */

/* Append tokens to several sessions of one model and evaluate them all in ONE forward pass: the rows of
 * every session go through each layer together (rows grouped by expert: each expert a layer needs is read
 * once for the whole batch), each row attending to its own session's KV cache / KDA state at its own
 * position. sessions[i] gets n[i] >= 1 tokens ids[i][0..n[i]). logits (may be NULL): n_seq rows of n_vocab
 * floats (the last position of each session, in order), or with DF_EVAL_ALL_LOGITS sum(n) rows (session
 * after session). Each session's logits and state are bit-identical to df_eval on it alone (the kernels
 * are batch-invariant). Errors: DF_EINVAL (sessions of different models, one session twice, n[i] < 1),
 * DF_ECONTEXT (a session would overflow; nothing is evaluated), DF_ENOMEM, and df_eval's; on an error no
 * session changes. One forward pass at a time per model (df_eval and df_eval_batch serialize). */
int df_eval_batch(df_session *const *sessions, const int32_t *const *ids, const int *n, int n_seq, float *logits,
                  int flags, char *err, size_t errlen);

/* Human-readable message for an error code. */
const char *df_strerror(int code);

/* Whether the compute backend `name` ("auto", "cpu", "cpu-scalar", "cpu-avx2", "cpu-avx512", "cuda") can run on this
 * machine: 1 with what it runs on in buf (for cuda and an auto that picks it, the device, e.g. "cuda: NVIDIA H200,
 * 139.8 GiB, sm_90"; else the backend's name, e.g. "cpu-avx512"), or 0 with the reason in buf (e.g. "no CUDA device
 * (...)", an invalid DF_CUDA_* variable, "this build has no CUDA backend"). buf may be NULL. */
int df_backend_available(const char *name, char *buf, size_t len);

/* ------------------------------------------------------ speculative decoding */

/* df_eval flag: the session's rollback snapshot becomes the state *before* this call's tokens
 * (tokens pending from an earlier truncation are evaluated first, in their own pass), instead of
 * the state after them. For models with recurrent (KDA) layers, a df_session_truncate to any
 * position at or after that point then restores the snapshot and re-evaluates only the kept
 * tokens past it (in front of the next df_eval); without the flag a truncation into a
 * multi-token call's tokens goes back to an older snapshot or position 0. No effect on models
 * without recurrent layers. Speculative verification sets it. */
enum { DF_EVAL_MARK = 2 };

/* A drafter proposes tokens that continue a token history; the target model then verifies them
 * (df_spec_*). Drafts need not be right: they only change speed, never the output. */
typedef struct df_drafter df_drafter;

/* Prompt lookup (n-gram) drafter, no model: finds the most recent earlier occurrence of the
 * history's last n tokens (n from n_max down to n_min, 1 <= n_min <= n_max <= 16) and proposes
 * the tokens that followed it. Defaults (0, 0): n_max 4, n_min 2. DF_EINVAL for bad n. */
int df_drafter_ngram_new(df_drafter **out, int n_max, int n_min, char *err, size_t errlen);
/* Draft-model drafter: a session of n_ctx positions (0 = the model's default) on `draft`, which
 * must share the target's vocabulary (same tokenizer; checked by the caller's df_spec_new:
 * vocabulary sizes must match). It proposes the draft model's greedy (argmax) tokens, catching
 * its session up with the history first (common prefix kept). The model stays owned by the
 * caller and must outlive the drafter. */
int df_drafter_model_new(df_drafter **out, df_model *draft, int n_ctx, char *err, size_t errlen);
/* Draft-model drafter with a different tokenizer: the draft model continues the *text* of the
 * history (target ids detokenized with target_tok, re-tokenized with the draft's own tokenizer),
 * and its drafted text is re-tokenized with target_tok; only the ids up to the last token
 * boundary both tokenizations agree on are proposed. Tokenizers stay owned by the caller. */
int df_drafter_retok_new(df_drafter **out, df_model *draft, const df_tokenizer *target_tok, int n_ctx, char *err,
                         size_t errlen);
void df_drafter_free(df_drafter *d);
/* "ngram", "model" or "model-retok". */
const char *df_drafter_kind(const df_drafter *d);

typedef struct {
    int k_max;           /* most tokens drafted per verification, 1..64 (default 8) */
    int adaptive;        /* 1 (default): k follows the recent acceptance (grows after a fully accepted
                            draft, shrinks to the accepted length + 1 after a rejection); 0: always k_max */
    int gate;            /* 1 (default): switch drafting off when it does not pay (see df_spec_step) */
    int window;          /* generated tokens per measurement window of the gate (default 32, at least 16) */
    int retry;           /* generated tokens decoded plainly before drafting is tried again after the gate
                            switched it off (default 256; doubles each time it fails again, up to 16x) */
} df_spec_opts;

void df_spec_opts_default(df_spec_opts *o);

/* A draft model drafter samples its drafts with these options (temperature > 0) and hands their
 * distribution q to the verification, which accepts a draft x with probability min(1, p(x)/q(x))
 * and on rejection samples from norm(max(0, p - q)) (Leviathan et al. 2023, Chen et al. 2023): the
 * output follows the target's distribution, but is no longer the sample plain decoding draws, and a
 * seed reproduces it only when the gate is off (the gate's timing decides which steps draft) and the
 * drafter's stream starts with the generation (call this before each one: it restarts the stream,
 * seeded from o->seed). NULL or temperature 0: greedy drafts (the default). DF_EINVAL for a drafter
 * without a model (n-gram) or with re-tokenization. */
int df_drafter_set_sampling(df_drafter *d, const df_sampler_opts *o, char *err, size_t errlen);
/* The distribution df_sample draws from for these logits (temperature, top-k and top-p applied), as
 * n_vocab probabilities (0 outside the kept tokens); greedy: 1 at the argmax. */
void df_sampler_probs(df_sampler *s, const float *logits, int n_vocab, float *probs);
/* The next number in [0, 1) of the sampler's seeded stream. */
double df_sampler_uniform(df_sampler *s);

/* The session's context size in positions (what df_session_new resolved n_ctx to). */
int df_session_n_ctx(const df_session *s);
/* The model a session belongs to. */
df_model *df_session_model(const df_session *s);

typedef struct {
    uint64_t generated;        /* tokens produced by df_spec_step (the caller's first token excluded) */
    uint64_t drafted;          /* draft tokens sent to verification */
    uint64_t accepted;         /* of them, accepted */
    uint64_t verify_calls;     /* multi-token verification evals */
    uint64_t plain_steps;      /* one-token evals (drafting off, or no draft proposed) */
    uint64_t gate_off;         /* times the gate switched drafting off */
    double draft_s;            /* wall time in the drafter */
    double verify_s;           /* wall time in verification evals (+ sampling) */
    double plain_s;            /* wall time in one-token steps (+ sampling) */
    double spec_tok_s;         /* last measured generated tok/s with drafting (draft cost included); 0 = none */
    double plain_tok_s;        /* last measured generated tok/s without drafting; 0 = none */
    int k;                     /* the current draft length */
    int drafting;              /* 1 when drafting is currently on */
    int probing;               /* 1 while drafting pauses for a plain window that measures the rate without it (the
                                * gate's baseline, taken at the start and now and then); 0 otherwise */
} df_spec_stats;

typedef struct df_spec df_spec;

/* A speculative generator over a target session (its prompt already evaluated) and a drafter.
 * smp is the caller's sampler, used for every token in order (one df_sample per generated token),
 * so with a point-mass draft (n-gram, or the draft model's argmax) the output is the very token
 * sequence plain decoding with the same sampler produces: greedy is byte-identical, and with a seed
 * it is the same sample; that is the standard speculative-sampling rule for a deterministic draft
 * (accept x with probability min(1, p(x)/q(x)) = p(x), on rejection sample from
 * norm(max(0, p - q)) = p without x; Leviathan et al. 2023, Chen et al. 2023). A drafter with
 * sampled drafts (df_drafter_set_sampling) goes through the general rule instead. target, d and smp
 * stay owned by the caller; d may be NULL (plain decoding). DF_EINVAL for a vocabulary mismatch. */
int df_spec_new(df_spec **out, df_session *target, df_drafter *d, df_sampler *smp, const df_spec_opts *o, char *err,
                size_t errlen);
void df_spec_free(df_spec *g);
/* Generate: `cur` is the last token produced (sampled, not yet in the target session).
 * Writes 1..cap tokens that follow it to out (evaluating cur and the accepted drafts into the
 * target session; the last token written is the new cur, not evaluated) and returns their count,
 * or a negative DF_E* with err. cap >= 1; at most cap tokens are produced and the session never
 * exceeds its context (DF_ECONTEXT when cur itself does not fit). The caller stops at a stop token
 * (tokens after it in out are to be dropped; df_session_truncate can drop them from the session). */
int df_spec_step(df_spec *g, int32_t cur, int32_t *out, int cap, char *err, size_t errlen);
void df_spec_get_stats(const df_spec *g, df_spec_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* DELTAFIN_H */
