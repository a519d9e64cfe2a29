/* jinja.h — deltafin's own Jinja2 subset interpreter for model chat templates
 * (tokenizer_config.json "chat_template" / chat_template.jinja).
 *
 * It reproduces what transformers' apply_chat_template renders: jinja2 3.1
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]) with transformers' tojson filter (json.dumps with
 * ensure_ascii / indent / separators / sort_keys), raise_exception and
 * strftime_now, jinja2's default Undefined, and Python value semantics (str(),
 * repr(), ==, <, truthiness, slicing by code point, json.dumps formatting).
 *
 * A template that uses a construct outside the subset is refused with
 * DF_EUNSUPPORTED and an error naming the construct and its line: never guessed.
 * docs/chat-formats.md lists the subset. */
#ifndef DF_JINJA_H
#define DF_JINJA_H

#include <stddef.h>

typedef struct jj_template jj_template;

/* Parse a template. Returns 0, DF_EINVAL (syntax error, as jinja2 would
 * raise) or DF_EUNSUPPORTED (valid Jinja outside the subset); err names the
 * line and the construct. */
int jj_parse(const char *src, size_t len, jj_template **out, char *err, size_t errlen);
void jj_free(jj_template *t);

/* Render with the variables of a JSON object (its members become template
 * variables: messages, tools, add_generation_prompt, bos_token, ...). JSON is
 * read as Python's json.loads would (1 and 1.0 stay an int and a float).
 * *out is malloc'd and NUL-terminated. Returns 0; DF_EINVAL when the template
 * raises (raise_exception, undefined access, type errors: the jinja2 message
 * is in err); DF_EUNSUPPORTED for a construct outside the subset met while
 * rendering (e.g. a Python string method we do not implement); DF_ENOMEM. */
int jj_render_json(const jj_template *t, const char *vars_json, size_t vars_len, char **out, size_t *out_len,
                   char *err, size_t errlen);

/* Options of jj_render_opts. JJ_TOOL_ARGS_OBJECTS: a tool call's "arguments"
 * string that holds a JSON object reaches the template as that object (in
 * messages[*].tool_calls[*].function, or the call itself) — what vLLM does for
 * every model and Kimi K3's own tokenizer does before encoding. */
enum { JJ_TOOL_ARGS_OBJECTS = 1 };
int jj_render_opts(const jj_template *t, const char *vars_json, size_t vars_len, int opts, char **out,
                   size_t *out_len, char *err, size_t errlen);

/* Python's repr() of a float (shortest round-trip digits, "1.0", "1e-05", "1e+16", "nan", "inf") into out;
 * returns its length (< 40). Used by the Jinja values and the chat formats' Python-style JSON. */
size_t jj_py_float_repr(double v, char out[64]);

#endif
