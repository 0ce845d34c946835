/* The execution plan a kernel library carries in its `.aotc_plan` section, checked as the Python
 * runtime's plan.py checks it: canonical JSON of a known version with exactly the known fields, every
 * call of every variant inside the buffers it names, param sizes equal to the kernel's, symbols that
 * are C identifiers and distinct, variants that agree on names and dtypes and differ in input shapes.
 *
 * Three optional top-level fields, all or none, let a package derive weights when it loads:
 * `weights_stored_nbytes` (what weights.bin holds, at most `weights_nbytes`), `prepare` (the symbol of
 * int32_t prepare(uint8_t *weights), which computes the rest) and `prepare_plan` (its calls, each on
 * the weights alone). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aotc_internal.h"

static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    {"bool", 1},    {"int8", 1},   {"uint8", 1},   {"int16", 2},   {"uint16", 2},  {"float16", 2},
    {"int32", 4},   {"uint32", 4}, {"float32", 4}, {"int64", 8},   {"uint64", 8},  {"float64", 8},
};

static const char *const BUFFER_KINDS[] = {"input", "output", "weight", "workspace"};

static const char *const PLAN_FIELDS[] = {"plan_version", "entry", "target", "triple", "requires",
                                          "inputs", "outputs", "workspace_bytes", "weights_nbytes",
                                          "kernels", "execution_plan"};
static const char *const VARIANTS_PLAN_FIELDS[] = {"plan_version", "target", "triple", "requires",
                                                   "weights_nbytes", "kernels", "variants"};
static const char *const PREPARE_FIELDS[] = {"prepare", "prepare_plan", "weights_stored_nbytes"};
static const char *const VARIANT_FIELDS[] = {"entry", "inputs", "outputs", "workspace_bytes", "execution_plan"};
static const char *const TENSOR_FIELDS[] = {"name", "shape", "dtype"};
static const char *const KERNEL_FIELDS[] = {"symbol", "params"};
static const char *const PARAM_FIELDS[] = {"dtype", "nbytes"};
static const char *const CALL_FIELDS[] = {"kernel", "args"};
static const char *const ARG_FIELDS[] = {"kind", "index", "offset", "nbytes"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

size_t dtype_size(const char *dtype) {
    for (size_t i = 0; i < COUNT(DTYPES); i++)
        if (strcmp(DTYPES[i].name, dtype) == 0)
            return DTYPES[i].size;
    return 0;
}

/* ------------------------------------------------------------------------------------ field checks */

static int is_text(const json_node *v) { return v && v->type == JSON_STRING && strlen(v->str) == v->len; }

static int plan_string(const json_node *v, const char *where, const char **out, aotc_reason *why) {
    if (!is_text(v))
        return aotc_reason_set(why, "the plan's %s is not a string", where);
    *out = v->str;
    return 0;
}

static int plan_symbol(const json_node *v, const char *where, const char **out, aotc_reason *why) {
    int ok = is_text(v) && v->len > 0 && !(v->str[0] >= '0' && v->str[0] <= '9');
    for (size_t i = 0; ok && i < v->len; i++) {
        char c = v->str[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    }
    if (!ok) {
        char shown[240];
        json_show(v, shown, sizeof shown);
        return aotc_reason_set(why, "the plan's %s %s is not a C identifier", where, shown);
    }
    *out = v->str;
    return 0;
}

static int plan_size(const json_node *v, const char *where, uint64_t *out, aotc_reason *why) {
    if (!v || v->type != JSON_INT || v->i < 0 || (uint64_t)v->i > PLAN_MAX_BYTES) {
        char shown[240];
        json_show(v, shown, sizeof shown);
        return aotc_reason_set(why, "the plan's %s %s is not a byte count", where, shown);
    }
    *out = (uint64_t)v->i;
    return 0;
}

static int plan_list(const json_node *v, const char *where, aotc_reason *why) {
    return v && v->type == JSON_ARRAY ? 0 : aotc_reason_set(why, "the plan's %s is not a list", where);
}

static int listed(const char *const *keys, size_t n, const char *key, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(keys[i]) == len && memcmp(keys[i], key, len) == 0)
            return 1;
    return 0;
}

/* `v` is an object with exactly the fields `keys`. */
static int plan_object(const json_node *v, const char *const *keys, size_t n, const char *where,
                       aotc_reason *why) {
    int ok = v && v->type == JSON_OBJECT && v->count == n;
    for (const json_node *c = ok ? v->first : NULL; c; c = c->next)
        ok = ok && listed(keys, n, c->key, c->key_len);
    if (ok)
        return 0;
    char fields[200] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "%s%s", i ? ", " : "", keys[i]);
    return aotc_reason_set(why, "the plan's %s must have exactly the fields %s", where, fields);
}

static int plan_dtype(const json_node *v, const char *where, const char **out, size_t *size, aotc_reason *why) {
    if (!is_text(v) || !(*size = dtype_size(v->str))) {
        char shown[240];
        json_show(v, shown, sizeof shown);
        return aotc_reason_set(why, "the plan's %s has the unsupported dtype %s", where, shown);
    }
    *out = v->str;
    return 0;
}

/* ------------------------------------------------------------------------------------------ parts */

typedef struct kernel_params {
    const char *symbol;
    size_t count;
    uint64_t *nbytes;
} kernel_params;

/* The kernels sorted by symbol: a plan may list millions (its size is the library's), so duplicates and
 * the kernel of each call are found in log n steps, never by comparing every pair. */
typedef struct kernel_table {
    const kernel_params **by_symbol;
    size_t count;
} kernel_table;

static int symbol_order(const void *x, const void *y) {
    return strcmp((*(const kernel_params *const *)x)->symbol, (*(const kernel_params *const *)y)->symbol);
}

static const kernel_params *find_kernel(const kernel_table *kernels, const char *symbol) {
    kernel_params key = {symbol, 0, NULL};
    const kernel_params *wanted = &key;
    const kernel_params **found =
        bsearch(&wanted, kernels->by_symbol, kernels->count, sizeof *kernels->by_symbol, symbol_order);
    return found ? *found : NULL;
}

static int name_order(const void *x, const void *y) {
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* A name `names` holds twice (sorting it), or NULL. */
static const char *repeated_name(const char **names, size_t n) {
    qsort(names, n, sizeof *names, name_order);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

static int plan_tensors(model_plan *plan, const json_node *v, const char *where, aotc_tensor_info **out,
                        int *count, aotc_reason *why) {
    if (plan_list(v, where, why))
        return -1;
    aotc_tensor_info *tensors = json_alloc(&plan->doc, (v->count ? v->count : 1) * sizeof *tensors);
    if (!tensors)
        return aotc_reason_set(why, "out of memory");
    int i = 0;
    for (const json_node *t = v->first; t; t = t->next, i++) {
        char at[160], sub[200];
        snprintf(at, sizeof at, "%s[%d]", where, i);
        aotc_tensor_info *info = &tensors[i];
        if (plan_object(t, TENSOR_FIELDS, COUNT(TENSOR_FIELDS), at, why))
            return -1;
        snprintf(sub, sizeof sub, "%s.name", at);
        if (plan_string(json_get(t, "name"), sub, &info->name, why) ||
            plan_dtype(json_get(t, "dtype"), at, &info->dtype, &info->itemsize, why))
            return -1;
        const json_node *shape = json_get(t, "shape");
        snprintf(sub, sizeof sub, "%s.shape", at);
        if (plan_list(shape, sub, why))
            return -1;
        int64_t *dims = json_alloc(&plan->doc, (shape->count ? shape->count : 1) * sizeof *dims);
        if (!dims)
            return aotc_reason_set(why, "out of memory");
        uint64_t nbytes = info->itemsize;
        int rank = 0;
        for (const json_node *d = shape->first; d; d = d->next) {
            uint64_t dim = 0;
            if (plan_size(d, sub, &dim, why))
                return -1;
            if (dim && nbytes > PLAN_MAX_BYTES / dim)
                return aotc_reason_set(why, "the plan's %s size is not a byte count", at);
            nbytes *= dim;
            dims[rank++] = (int64_t)dim;
        }
        info->rank = rank;
        info->shape = dims;
        info->nbytes = (size_t)nbytes;
    }
    *out = tensors;
    *count = i;
    return 0;
}

static int plan_kernels(model_plan *plan, const json_node *v, const char *const *entries, int num_entries,
                        kernel_table *out, aotc_reason *why) {
    if (plan_list(v, "kernels", why))
        return -1;
    kernel_params *kernels = json_alloc(&plan->doc, (v->count ? v->count : 1) * sizeof *kernels);
    const kernel_params **by_symbol = json_alloc(&plan->doc, (v->count ? v->count : 1) * sizeof *by_symbol);
    plan->kernels = json_alloc(&plan->doc, (v->count ? v->count : 1) * sizeof *plan->kernels);
    if (!kernels || !by_symbol || !plan->kernels)
        return aotc_reason_set(why, "out of memory");
    int i = 0;
    for (const json_node *k = v->first; k; k = k->next, i++) {
        char at[64], sub[128];
        snprintf(at, sizeof at, "kernels[%d]", i);
        if (plan_object(k, KERNEL_FIELDS, COUNT(KERNEL_FIELDS), at, why))
            return -1;
        snprintf(sub, sizeof sub, "%s.symbol", at);
        const char *symbol;
        if (plan_symbol(json_get(k, "symbol"), sub, &symbol, why))
            return -1;
        const json_node *params = json_get(k, "params");
        snprintf(sub, sizeof sub, "%s.params", at);
        if (plan_list(params, sub, why))
            return -1;
        kernels[i].symbol = symbol;
        kernels[i].count = params->count;
        kernels[i].nbytes = json_alloc(&plan->doc, (params->count ? params->count : 1) * sizeof(uint64_t));
        if (!kernels[i].nbytes)
            return aotc_reason_set(why, "out of memory");
        size_t j = 0;
        for (const json_node *p = params->first; p; p = p->next, j++) {
            const char *dtype;
            size_t itemsize;
            snprintf(sub, sizeof sub, "%s.params[%zu]", at, j);
            if (plan_object(p, PARAM_FIELDS, COUNT(PARAM_FIELDS), sub, why) ||
                plan_dtype(json_get(p, "dtype"), sub, &dtype, &itemsize, why))
                return -1;
            snprintf(sub + strlen(sub), sizeof sub - strlen(sub), ".nbytes");
            if (plan_size(json_get(p, "nbytes"), sub, &kernels[i].nbytes[j], why))
                return -1;
        }
        plan->kernels[i].symbol = symbol;
        by_symbol[i] = &kernels[i];
    }
    plan->num_kernels = i;
    qsort(by_symbol, (size_t)i, sizeof *by_symbol, symbol_order);
    out->by_symbol = by_symbol;
    out->count = (size_t)i;
    for (int j = 1; j < i; j++)
        if (symbol_order(&by_symbol[j - 1], &by_symbol[j]) == 0)
            return aotc_reason_set(why, "the plan names the kernel %s twice", by_symbol[j]->symbol);
    for (int j = 0; j < num_entries; j++)
        if (find_kernel(out, entries[j]))
            return aotc_reason_set(why, "the plan names the kernel %s twice", entries[j]);
    return 0;
}

/* One call: a known kernel, one argument per param of its size, each inside the buffer it names. */
static int plan_call(const json_node *c, const char *where, const kernel_table *kernels,
                     const uint64_t *const bounds[4], const uint64_t counts[4], aotc_reason *why) {
    char sub[200];
    const char *kernel;
    if (plan_object(c, CALL_FIELDS, COUNT(CALL_FIELDS), where, why))
        return -1;
    snprintf(sub, sizeof sub, "%s.kernel", where);
    if (plan_symbol(json_get(c, "kernel"), sub, &kernel, why))
        return -1;
    const kernel_params *k = find_kernel(kernels, kernel);
    if (!k)
        return aotc_reason_set(why, "the plan's %s calls %s, which is not one of its kernels", where, kernel);
    const json_node *args = json_get(c, "args");
    snprintf(sub, sizeof sub, "%s.args", where);
    if (plan_list(args, sub, why))
        return -1;
    if (args->count != k->count)
        return aotc_reason_set(why, "the plan's %s passes %zu arguments to %s of %zu params", where,
                               args->count, kernel, k->count);
    size_t j = 0;
    for (const json_node *a = args->first; a; a = a->next, j++) {
        char at[240], field[260];
        snprintf(at, sizeof at, "%s.args[%zu]", where, j);
        if (plan_object(a, ARG_FIELDS, COUNT(ARG_FIELDS), at, why))
            return -1;
        const json_node *kind_node = json_get(a, "kind");
        int kind = -1;
        for (int i = 0; i < 4; i++)
            if (json_is_string(kind_node, BUFFER_KINDS[i]))
                kind = i;
        if (kind < 0) {
            char shown[240];
            json_show(kind_node, shown, sizeof shown);
            return aotc_reason_set(why, "the plan's %s.kind %s is not one of input, output, weight, workspace",
                                   at, shown);
        }
        uint64_t index = 0, offset = 0, nbytes = 0;
        snprintf(field, sizeof field, "%s.index", at);
        if (plan_size(json_get(a, "index"), field, &index, why))
            return -1;
        snprintf(field, sizeof field, "%s.offset", at);
        if (plan_size(json_get(a, "offset"), field, &offset, why))
            return -1;
        snprintf(field, sizeof field, "%s.nbytes", at);
        if (plan_size(json_get(a, "nbytes"), field, &nbytes, why))
            return -1;
        if (nbytes != k->nbytes[j])
            return aotc_reason_set(why, "the plan's %s is %llu bytes but %s was compiled for %llu", at,
                                   (unsigned long long)nbytes, kernel, (unsigned long long)k->nbytes[j]);
        if (index >= counts[kind])
            return aotc_reason_set(why, "the plan's %s refers to %s %llu of %llu", at, BUFFER_KINDS[kind],
                                   (unsigned long long)index, (unsigned long long)counts[kind]);
        uint64_t bound = bounds[kind][index];
        if (offset + nbytes > bound) /* both at most 2^48: no overflow */
            return aotc_reason_set(why, "the plan's %s covers bytes [%llu, %llu) of a %llu-byte %s", at,
                                   (unsigned long long)offset, (unsigned long long)(offset + nbytes),
                                   (unsigned long long)bound, BUFFER_KINDS[kind]);
    }
    return 0;
}

static int plan_variant_of(model_plan *plan, const json_node *doc, const char *at, plan_variant *v,
                           const kernel_table *kernels, aotc_reason *why) {
    char where[160];
    snprintf(where, sizeof where, "%sinputs", at);
    if (plan_tensors(plan, json_get(doc, "inputs"), where, &v->inputs, &v->num_inputs, why))
        return -1;
    snprintf(where, sizeof where, "%soutputs", at);
    if (plan_tensors(plan, json_get(doc, "outputs"), where, &v->outputs, &v->num_outputs, why))
        return -1;
    size_t total = (size_t)v->num_inputs + (size_t)v->num_outputs;
    const char **names = json_alloc(&plan->doc, (total ? total : 1) * sizeof *names);
    if (!names)
        return aotc_reason_set(why, "out of memory");
    for (int i = 0; i < v->num_inputs; i++)
        names[i] = v->inputs[i].name;
    for (int i = 0; i < v->num_outputs; i++)
        names[v->num_inputs + i] = v->outputs[i].name;
    if (repeated_name(names, total))
        return aotc_reason_set(why, "the plan %snames an input or output twice", at);
    snprintf(where, sizeof where, "%sworkspace_bytes", at);
    if (plan_size(json_get(doc, "workspace_bytes"), where, &v->workspace_bytes, why))
        return -1;
    uint64_t *in_sizes = json_alloc(&plan->doc, (size_t)(v->num_inputs + 1) * sizeof(uint64_t));
    uint64_t *out_sizes = json_alloc(&plan->doc, (size_t)(v->num_outputs + 1) * sizeof(uint64_t));
    if (!in_sizes || !out_sizes)
        return aotc_reason_set(why, "out of memory");
    for (int i = 0; i < v->num_inputs; i++)
        in_sizes[i] = v->inputs[i].nbytes;
    for (int i = 0; i < v->num_outputs; i++)
        out_sizes[i] = v->outputs[i].nbytes;
    const uint64_t *bounds[4] = {in_sizes, out_sizes, &plan->weights_nbytes, &v->workspace_bytes};
    const uint64_t counts[4] = {(uint64_t)v->num_inputs, (uint64_t)v->num_outputs, 1, 1};
    const json_node *calls = json_get(doc, "execution_plan");
    snprintf(where, sizeof where, "%sexecution_plan", at);
    if (plan_list(calls, where, why))
        return -1;
    int i = 0;
    for (const json_node *c = calls->first; c; c = c->next, i++) {
        snprintf(where, sizeof where, "%sexecution_plan[%d]", at, i);
        if (plan_call(c, where, kernels, bounds, counts, why))
            return -1;
    }
    return 0;
}

static int same_shape(const aotc_tensor_info *a, const aotc_tensor_info *b) {
    if (a->rank != b->rank)
        return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

static int same_names_and_dtypes(const aotc_tensor_info *a, int n, const aotc_tensor_info *b, int m) {
    if (n != m)
        return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(a[i].name, b[i].name) != 0 || strcmp(a[i].dtype, b[i].dtype) != 0)
            return 0;
    return 1;
}

/* Variants are one model at several shapes: the same names and dtypes, input shapes that differ. */
static int variants_agree(const model_plan *plan, aotc_reason *why) {
    const plan_variant *first = &plan->variants[0];
    for (int i = 0; i < plan->num_variants; i++) {
        const plan_variant *v = &plan->variants[i];
        if (!same_names_and_dtypes(v->inputs, v->num_inputs, first->inputs, first->num_inputs))
            return aotc_reason_set(why, "the plan's variants[%d].inputs differ from variants[0]'s in names or dtypes", i);
        if (!same_names_and_dtypes(v->outputs, v->num_outputs, first->outputs, first->num_outputs))
            return aotc_reason_set(why, "the plan's variants[%d].outputs differ from variants[0]'s in names or dtypes", i);
        for (int j = 0; j < i; j++) {
            int same = 1;
            for (int t = 0; t < v->num_inputs && same; t++)
                same = same_shape(&v->inputs[t], &plan->variants[j].inputs[t]);
            if (same)
                return aotc_reason_set(why, "the plan's variants[%d] has the input shapes of variants[%d]", i, j);
        }
    }
    return 0;
}

/* The top-level fields are those of the version, no more, no fewer, and the prepare fields all or none. */
static int plan_fields(const json_node *doc, int version, aotc_reason *why) {
    const char *const *fields = version == 1 ? PLAN_FIELDS : VARIANTS_PLAN_FIELDS;
    size_t n = version == 1 ? COUNT(PLAN_FIELDS) : COUNT(VARIANTS_PLAN_FIELDS);
    for (size_t i = 0; i < n; i++)
        if (!json_get(doc, fields[i]))
            return aotc_reason_set(why, "the plan lacks the field %s", fields[i]);
    size_t prepare_fields = 0;
    for (const json_node *c = doc->first; c; c = c->next) {
        if (listed(PREPARE_FIELDS, COUNT(PREPARE_FIELDS), c->key, c->key_len))
            prepare_fields++;
        else if (!listed(fields, n, c->key, c->key_len))
            return aotc_reason_set(why, "the plan has the field \"%.60s\", which this runtime does not know", c->key);
    }
    if (prepare_fields && prepare_fields != COUNT(PREPARE_FIELDS))
        return aotc_reason_set(why, "the plan has some of the fields prepare, prepare_plan, weights_stored_nbytes "
                               "but not all");
    return 0;
}

/* The load-time calls: every argument inside the weights (no input, output or workspace exists then),
 * and weights.bin no larger than the weights buffer. */
static int plan_prepare(model_plan *plan, const json_node *doc, const kernel_table *kernels, aotc_reason *why) {
    plan->weights_stored_nbytes = plan->weights_nbytes;
    if (!plan->prepare)
        return 0;
    if (plan_size(json_get(doc, "weights_stored_nbytes"), "weights_stored_nbytes", &plan->weights_stored_nbytes,
                  why))
        return -1;
    if (plan->weights_stored_nbytes > plan->weights_nbytes)
        return aotc_reason_set(why, "the plan's weights_stored_nbytes %llu exceeds weights_nbytes %llu",
                               (unsigned long long)plan->weights_stored_nbytes,
                               (unsigned long long)plan->weights_nbytes);
    const uint64_t *bounds[4] = {NULL, NULL, &plan->weights_nbytes, NULL};
    const uint64_t counts[4] = {0, 0, 1, 0};
    const json_node *calls = json_get(doc, "prepare_plan");
    if (plan_list(calls, "prepare_plan", why))
        return -1;
    int i = 0;
    for (const json_node *c = calls->first; c; c = c->next, i++) {
        char where[40];
        snprintf(where, sizeof where, "prepare_plan[%d]", i);
        if (plan_call(c, where, kernels, bounds, counts, why))
            return -1;
    }
    return 0;
}

/* The plan's requires: a list of strings. */
static int plan_requires(model_plan *plan, const json_node *doc, aotc_reason *why) {
    plan->requires = json_get(doc, "requires");
    if (plan_list(plan->requires, "requires", why))
        return -1;
    int i = 0;
    for (const json_node *f = plan->requires->first; f; f = f->next, i++) {
        char at[40];
        const char *name;
        snprintf(at, sizeof at, "requires[%d]", i);
        if (plan_string(f, at, &name, why))
            return -1;
    }
    return 0;
}

/* The variants' documents: the plan itself for version 1, each of `variants` for version 2. */
static int plan_described(model_plan *plan, const json_node *doc, const json_node ***out, aotc_reason *why) {
    const json_node *found = plan->version == 1 ? NULL : json_get(doc, "variants");
    if (plan->version == 2) {
        if (plan_list(found, "variants", why))
            return -1;
        if (found->count == 0)
            return aotc_reason_set(why, "the plan's variants list is empty");
    }
    size_t n = plan->version == 1 ? 1 : found->count;
    if (n > 4096)
        return aotc_reason_set(why, "the plan has %zu variants", n);
    const json_node **described = json_alloc(&plan->doc, n * sizeof *described);
    plan->variants = json_alloc(&plan->doc, n * sizeof *plan->variants);
    if (!described || !plan->variants)
        return aotc_reason_set(why, "out of memory");
    memset(plan->variants, 0, n * sizeof *plan->variants);
    if (plan->version == 1) {
        described[0] = doc;
    } else {
        size_t i = 0;
        for (const json_node *v = found->first; v; v = v->next, i++) {
            char at[40];
            snprintf(at, sizeof at, "variants[%zu]", i);
            if (plan_object(v, VARIANT_FIELDS, COUNT(VARIANT_FIELDS), at, why))
                return -1;
            described[i] = v;
        }
    }
    plan->num_variants = (int)n;
    *out = described;
    return 0;
}

static int check_canonical(const char *raw, size_t len, const json_node *root, aotc_reason *why) {
    json_buffer canonical = {0};
    aotc_reason inner;
    if (json_encode(root, &canonical, 0, &inner)) {
        json_buffer_free(&canonical);
        return aotc_reason_set(why, "the plan is not in canonical form (%s)", inner.text);
    }
    int same = canonical.len == len && memcmp(canonical.data, raw, len) == 0;
    json_buffer_free(&canonical);
    return same ? 0 : aotc_reason_set(why, "the plan is not in canonical form");
}

int plan_parse(const char *raw, size_t len, model_plan *plan, aotc_reason *why) {
    memset(plan, 0, sizeof *plan);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)raw[i] >= 0x80)
            return aotc_reason_set(why, "the plan is not valid JSON (a byte outside ASCII at %zu)", i);
    aotc_reason inner;
    if (json_parse(raw, len, &plan->doc, &inner))
        return aotc_reason_set(why, "the plan is not valid JSON (%s)", inner.text);
    const json_node *doc = plan->doc.root;
    if (doc->type != JSON_OBJECT)
        return aotc_reason_set(why, "the plan is not a JSON object");
    if (check_canonical(raw, len, doc, why))
        return -1;
    const json_node *version = json_get(doc, "plan_version");
    if (!version || version->type != JSON_INT || (version->i != 1 && version->i != 2)) {
        char shown[240];
        json_show(version, shown, sizeof shown);
        return aotc_reason_set(why, "the plan has version %s, this runtime reads 1 and 2", shown);
    }
    plan->version = (int)version->i;
    const json_node **described = NULL;
    if (plan_fields(doc, plan->version, why) ||
        plan_string(json_get(doc, "target"), "target", &plan->target, why) ||
        plan_string(json_get(doc, "triple"), "triple", &plan->triple, why) || plan_requires(plan, doc, why) ||
        plan_size(json_get(doc, "weights_nbytes"), "weights_nbytes", &plan->weights_nbytes, why) ||
        plan_described(plan, doc, &described, why))
        return -1;
    /* the entry symbols: each variant's, then prepare's */
    int num_entries = plan->num_variants + (json_get(doc, "prepare") != NULL);
    const char **entries = json_alloc(&plan->doc, (size_t)num_entries * sizeof *entries);
    if (!entries)
        return aotc_reason_set(why, "out of memory");
    for (int i = 0; i < num_entries; i++) {
        char at[40];
        snprintf(at, sizeof at, plan->version == 1 ? "entry" : "variants[%d].entry", i);
        const json_node *symbol = i < plan->num_variants ? json_get(described[i], "entry") : json_get(doc, "prepare");
        if (plan_symbol(symbol, i < plan->num_variants ? at : "prepare", &entries[i], why))
            return -1;
        for (int j = 0; j < i; j++)
            if (strcmp(entries[i], entries[j]) == 0)
                return aotc_reason_set(why, "the plan names an entry symbol twice");
        if (i < plan->num_variants)
            plan->variants[i].entry = entries[i];
        else
            plan->prepare = entries[i];
    }
    kernel_table kernels = {NULL, 0};
    if (plan_kernels(plan, json_get(doc, "kernels"), entries, num_entries, &kernels, why))
        return -1;
    for (int i = 0; i < plan->num_variants; i++) {
        char at[40] = "";
        if (plan->version == 2)
            snprintf(at, sizeof at, "variants[%d].", i);
        if (plan_variant_of(plan, described[i], at, &plan->variants[i], &kernels, why))
            return -1;
    }
    return variants_agree(plan, why) || plan_prepare(plan, doc, &kernels, why) ? -1 : 0;
}

void plan_free(model_plan *plan) { json_free(&plan->doc); }
