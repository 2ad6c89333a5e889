/*
** s3.c — objects in S3-compatible storage read as data files.
**
** libcurl does the HTTP and signs each request with AWS Signature V4 (CURLOPT_AWS_SIGV4);
** libxml2 parses the ListObjectsV2 answers. Addressing is path-style
** (ENDPOINT/BUCKET/KEY), which S3-compatible servers all take. What is here:
**   - listing a prefix, page by page, matched against a glob (s3://b/shards/ *.jsonl);
**   - ranged GETs that retry 5xx answers, timeouts, stalls and dropped connections with
**     backoff, and fail at once, with the server's reason, on 4xx (a missing object,
**     wrong credentials);
**   - a FILE* over an object (glibc's fopencookie) that reads it in blocks and fetches the
**     next block on a thread of its own while the current one is consumed, so the
**     document reader's getline/fseeko work unchanged and rarely wait on the network.
** Settings come from the usual AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
** AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 /
** AWS_ENDPOINT_URL) unless tt_s3_configure names them.
*/
#define _GNU_SOURCE
#include "data/bpe_internal.h"
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef TETRA_HAVE_CURL
#include <curl/curl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#endif

int tt_s3_is_url(const char *path) { return path && strncmp(path, "s3://", 5) == 0; }

#ifndef TETRA_HAVE_CURL

static int not_built(const char *url) {
  return tt_set_error("%s: this tetra was built without libcurl, so s3:// paths cannot be "
                      "read (install libcurl4-openssl-dev and libxml2-dev, rebuild)", url);
}
int tt_s3_configure(const char *endpoint, const char *region, int retries, double timeout_s,
                    int64_t block_bytes) {
  (void)endpoint, (void)region, (void)retries, (void)timeout_s, (void)block_bytes;
  return 0;
}
int tt_s3_list(const char *pattern, char ***urls, int64_t **sizes, int *n) {
  (void)urls, (void)sizes, (void)n;
  return not_built(pattern);
}
int tt_s3_read(const char *url, int64_t off, void *buf, size_t len) {
  (void)off, (void)buf, (void)len;
  return not_built(url);
}
FILE *tt_s3_fopen(const char *url, int64_t size) {
  (void)size;
  not_built(url);
  return NULL;
}
int tt_s3_local_copy(const char *url, int64_t size, char *path, size_t cap) {
  (void)size, (void)path, (void)cap;
  return not_built(url);
}
void tt_s3_counters(int64_t *requests, int64_t *retries, int64_t *bytes) {
  *requests = *retries = *bytes = 0;
}

#else

/* -- Settings ----------------------------------------------------------------------- */

static struct {
  pthread_mutex_t lock;
  int ready;
  char endpoint[512], region[64];
  char userpwd[512], sigv4[128], token_header[2048];
  int retries;
  double timeout_s;
  int64_t block;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER, .retries = 6, .timeout_s = 20, .block = 8 << 20};

static char cfg_endpoint[512], cfg_region[64];
static int64_t n_requests, n_retries, n_bytes;   /* atomics (counters for the bench) */

static const char *env(const char *a, const char *b) {
  const char *v = getenv(a);
  if ((!v || !*v) && b) v = getenv(b);
  return v && *v ? v : NULL;
}

int tt_s3_configure(const char *endpoint, const char *region, int retries, double timeout_s,
                    int64_t block_bytes) {
  pthread_mutex_lock(&S.lock);
  snprintf(cfg_endpoint, sizeof cfg_endpoint, "%s", endpoint ? endpoint : "");
  snprintf(cfg_region, sizeof cfg_region, "%s", region ? region : "");
  if (retries >= 0) S.retries = retries;
  if (timeout_s > 0) S.timeout_s = timeout_s;
  if (block_bytes > 0) S.block = block_bytes;
  S.ready = 0;   /* read again on the next request */
  pthread_mutex_unlock(&S.lock);
  return 0;
}

static void init_libraries(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  xmlInitParser();
}

/* Fills S from the configured values and the environment, once. */
static int settings(const char *url) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_libraries);
  pthread_mutex_lock(&S.lock);
  int rc = 0;
  if (!S.ready) {
    const char *key = env("AWS_ACCESS_KEY_ID", NULL), *secret = env("AWS_SECRET_ACCESS_KEY", NULL);
    const char *region = cfg_region[0] ? cfg_region : env("AWS_REGION", "AWS_DEFAULT_REGION");
    if (!region) region = "us-east-1";
    const char *ep = cfg_endpoint[0] ? cfg_endpoint : env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
    const char *token = env("AWS_SESSION_TOKEN", NULL);
    if (!key || !secret) {
      rc = tt_set_error("%s: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", url);
    } else if (strchr(region, ':') || strlen(region) >= sizeof S.region) {
      rc = tt_set_error("%s: AWS_REGION '%s' is not a region name", url, region);
    } else {
      snprintf(S.region, sizeof S.region, "%s", region);
      if (ep) snprintf(S.endpoint, sizeof S.endpoint, "%s", ep);
      else snprintf(S.endpoint, sizeof S.endpoint, "https://s3.%s.amazonaws.com", region);
      size_t l = strlen(S.endpoint);
      while (l > 0 && S.endpoint[l - 1] == '/') S.endpoint[--l] = '\0';
      snprintf(S.userpwd, sizeof S.userpwd, "%s:%s", key, secret);
      snprintf(S.sigv4, sizeof S.sigv4, "aws:amz:%s:s3", S.region);
      S.token_header[0] = '\0';
      if (token) snprintf(S.token_header, sizeof S.token_header, "x-amz-security-token: %s", token);
      S.ready = 1;
    }
  }
  pthread_mutex_unlock(&S.lock);
  return rc;
}

void tt_s3_counters(int64_t *requests, int64_t *retries, int64_t *bytes) {
  *requests = __atomic_load_n(&n_requests, __ATOMIC_RELAXED);
  *retries = __atomic_load_n(&n_retries, __ATOMIC_RELAXED);
  *bytes = __atomic_load_n(&n_bytes, __ATOMIC_RELAXED);
}

/* -- URLs --------------------------------------------------------------------------- */

/* s3://bucket/key -> bucket and key (key may be empty). */
static int split_url(const char *url, char *bucket, size_t bcap, const char **key) {
  const char *b = url + 5, *slash = strchr(b, '/');
  size_t bl = slash ? (size_t)(slash - b) : strlen(b);
  if (bl == 0 || bl >= bcap) return tt_set_error("%s: expected s3://BUCKET/KEY", url);
  memcpy(bucket, b, bl);
  bucket[bl] = '\0';
  *key = slash ? slash + 1 : "";
  return 0;
}

/* Percent-encodes s the way SigV4 wants it: unreserved bytes stay, '/' stays when
** keep_slash, everything else is %XX. */
static int encode(tt_buf *out, const char *s, int keep_slash) {
  static const char hex[] = "0123456789ABCDEF";
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned c = *p;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      TT_TRY(tt_buf_append(out, p, 1));
    } else {
      char e[3] = {'%', hex[c >> 4], hex[c & 15]};
      TT_TRY(tt_buf_append(out, e, 3));
    }
  }
  return 0;
}

/* -- Requests ----------------------------------------------------------------------- */

typedef struct sink {
  CURL *h;
  tt_buf *body;          /* whole answers (listing, error bodies) */
  char *dst;             /* ranged reads: exactly cap bytes wanted */
  size_t got, cap;
  int overflow;
} sink;

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
  sink *s = ud;
  size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
  if (s->dst && status < 300) {
    if (s->got + len > s->cap) {   /* an error body, or a server ignoring the range */
      s->overflow = 1;
      return 0;
    }
    memcpy(s->dst + s->got, p, len);
    s->got += len;
    return len;
  }
  if (tt_buf_append(s->body, p, len) != 0) return 0;
  if (!s->dst) s->got += len;
  return len;
}

static pthread_key_t handle_key;
static pthread_once_t handle_once = PTHREAD_ONCE_INIT;
static void free_handle(void *h) { curl_easy_cleanup(h); }
static void make_handle_key(void) { pthread_key_create(&handle_key, free_handle); }

/* This thread's easy handle (kept so that connections are reused). */
static CURL *handle(void) {
  pthread_once(&handle_once, make_handle_key);
  CURL *h = pthread_getspecific(handle_key);
  if (!h) {
    h = curl_easy_init();
    if (h) pthread_setspecific(handle_key, h);
  }
  return h;
}

/* The <Code> and <Message> of an S3 error body, if it has them. */
static void error_reason(const tt_buf *body, char *out, size_t cap) {
  out[0] = '\0';
  if (!body || body->len == 0) return;
  xmlDocPtr doc = xmlReadMemory(body->data, (int)body->len, "error.xml", NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
  if (!doc) return;
  xmlNodePtr root = xmlDocGetRootElement(doc);
  char code[128] = "", msg[256] = "";
  for (xmlNodePtr c = root ? root->children : NULL; c; c = c->next) {
    if (c->type != XML_ELEMENT_NODE) continue;
    xmlChar *t = xmlNodeGetContent(c);
    if (!xmlStrcmp(c->name, (const xmlChar *)"Code")) snprintf(code, sizeof code, "%s", (char *)t);
    if (!xmlStrcmp(c->name, (const xmlChar *)"Message")) snprintf(msg, sizeof msg, "%s", (char *)t);
    xmlFree(t);
  }
  xmlFreeDoc(doc);
  /* The line is for a person: a long message is cut at cap, which is what we want. */
  if (code[0] && snprintf(out, cap, "%s%s%s", code, msg[0] ? ": " : "", msg) >= (int)cap)
    return;
}

static void backoff(int attempt) {
  double s = 0.1 * (double)(1 << (attempt < 6 ? attempt : 6));
  if (s > 5) s = 5;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* GET path (already encoded, with its query) from the endpoint. With dst: bytes
** [off, off + len) into dst, exactly; else the whole answer into body. `what` names the
** object in errors. Retries what can pass (5xx, 429, network errors, short bodies). */
static int get(const char *what, const char *path, int64_t off, char *dst, size_t len, tt_buf *body) {
  TT_TRY(settings(what));
  CURL *h = handle();
  if (!h) return tt_set_error("%s: cannot start libcurl", what);
  tt_buf url = {0}, errbody = {0};
  TT_TRY(tt_buf_printf(&url, "%s%s", S.endpoint, path));
  char range[64], reason[512] = "";
  size_t done = 0;
  int rc = -1;
  for (int attempt = 0;; attempt++) {
    if (attempt > S.retries) {
      tt_set_error("%s: giving up after %d tries: %s", what, attempt, reason);
      break;
    }
    if (attempt > 0) {
      __atomic_add_fetch(&n_retries, 1, __ATOMIC_RELAXED);
      backoff(attempt - 1);
    }
    __atomic_add_fetch(&n_requests, 1, __ATOMIC_RELAXED);
    errbody.len = 0;
    if (body) body->len = 0;
    sink s = {.h = h, .body = dst ? &errbody : body, .dst = dst ? dst + done : NULL, .cap = len - done};
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url.data);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, S.sigv4);
    curl_easy_setopt(h, CURLOPT_USERPWD, S.userpwd);
    struct curl_slist *hdr = curl_slist_append(NULL, "x-amz-content-sha256: "
                                               "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    if (S.token_header[0]) hdr = curl_slist_append(hdr, S.token_header);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    if (dst) {
      snprintf(range, sizeof range, "%lld-%lld", (long long)(off + (int64_t)done),
               (long long)(off + (int64_t)len - 1));
      curl_easy_setopt(h, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(S.timeout_s * 1000));
    /* A stalled transfer (under 1 byte/s for timeout_s) is dropped and retried. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(S.timeout_s < 1 ? 1 : S.timeout_s));
    CURLcode cc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (dst) {
      done += s.got;
      __atomic_add_fetch(&n_bytes, (int64_t)s.got, __ATOMIC_RELAXED);
    }
    if (cc == CURLE_OK && (status == 200 || status == 206)) {
      if (!dst) { rc = 0; break; }
      if (done == len) { rc = 0; break; }
      snprintf(reason, sizeof reason, "short read (%zu of %zu bytes)", done, len);
      continue;
    }
    if (cc == CURLE_WRITE_ERROR && s.overflow && (status == 200 || status == 206)) {
      tt_set_error("%s: the server sent more than the %zu bytes asked for (ranged reads "
                   "unsupported?)", what, len);
      break;
    }
    if (status >= 300) {
      char why[384];
      error_reason(dst ? &errbody : body, why, sizeof why);
      snprintf(reason, sizeof reason, "HTTP %ld%s%s", status, why[0] ? " " : "", why);
      if (status < 500 && status != 429) {
        const char *hint = status == 403 ? " (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the region)"
                           : status == 404 ? " (no such bucket or object)" : "";
        tt_set_error("%s: %s%s", what, reason, hint);
        break;
      }
      continue;
    }
    snprintf(reason, sizeof reason, "%s", curl_easy_strerror(cc));
  }
  tt_buf_free(&url);
  tt_buf_free(&errbody);
  return rc;
}

int tt_s3_read(const char *url, int64_t off, void *buf, size_t len) {
  if (len == 0) return 0;
  char bucket[256];
  const char *key = NULL;
  TT_TRY(split_url(url, bucket, sizeof bucket, &key));
  tt_buf path = {0};
  int rc = tt_buf_printf(&path, "/%s/", bucket);
  if (!rc) rc = encode(&path, key, 1);
  if (!rc) rc = get(url, path.data, off, buf, len, NULL);
  tt_buf_free(&path);
  return rc;
}

/* -- Listing ------------------------------------------------------------------------ */

static const char *child_text(xmlNodePtr n, const char *name, char *buf, size_t cap) {
  for (xmlNodePtr c = n->children; c; c = c->next) {
    if (c->type == XML_ELEMENT_NODE && !xmlStrcmp(c->name, (const xmlChar *)name)) {
      xmlChar *t = xmlNodeGetContent(c);
      snprintf(buf, cap, "%s", t ? (const char *)t : "");
      xmlFree(t);
      return buf;
    }
  }
  return NULL;
}

int tt_s3_list(const char *pattern, char ***urls_out, int64_t **sizes_out, int *n_out) {
  *urls_out = NULL;
  *sizes_out = NULL;
  *n_out = 0;
  char bucket[256];
  const char *key = NULL;
  TT_TRY(split_url(pattern, bucket, sizeof bucket, &key));
  size_t lit = strcspn(key, "*?[");
  int is_glob = key[lit] != '\0';
  char *prefix = strndup(key, lit);
  if (!prefix) return tt_set_error("out of host memory");
  char **urls = NULL;
  int64_t *sizes = NULL;
  int n = 0, cap = 0, rc = -1;
  char token[2048] = "", k[2048], num[64], flag[16];
  tt_buf path = {0}, body = {0};
  /* Keys per listing page: the server's default (1000) unless TETRA_S3_LIST_PAGE says
  ** fewer (the tests use it to list a few objects over several pages). */
  const char *pk = getenv("TETRA_S3_LIST_PAGE");
  int page_keys = pk ? atoi(pk) : 0;
  for (int page = 0;; page++) {
    /* Query parameters in canonical (sorted) order: the signature covers them. */
    path.len = 0;
    if (tt_buf_printf(&path, "/%s?", bucket)) goto done;
    if (token[0] && (tt_buf_printf(&path, "continuation-token=") || encode(&path, token, 0) ||
                     tt_buf_printf(&path, "&")))
      goto done;
    if (tt_buf_printf(&path, "list-type=2&") || (page_keys > 0 && tt_buf_printf(&path, "max-keys=%d&", page_keys)) ||
        tt_buf_printf(&path, "prefix=") || encode(&path, prefix, 0))
      goto done;
    if (get(pattern, path.data, 0, NULL, 0, &body)) goto done;
    xmlDocPtr doc = xmlReadMemory(body.data, (int)body.len, "list.xml", NULL,
                                  XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNodePtr root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (!root || xmlStrcmp(root->name, (const xmlChar *)"ListBucketResult")) {
      if (doc) xmlFreeDoc(doc);
      tt_set_error("%s: the server's object listing is not a ListBucketResult", pattern);
      goto done;
    }
    for (xmlNodePtr c = root->children; c; c = c->next) {
      if (c->type != XML_ELEMENT_NODE || xmlStrcmp(c->name, (const xmlChar *)"Contents")) continue;
      if (!child_text(c, "Key", k, sizeof k) || !child_text(c, "Size", num, sizeof num)) continue;
      int match = is_glob ? fnmatch(key, k, FNM_PATHNAME) == 0 : strcmp(key, k) == 0;
      if (!match) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        char **u = realloc(urls, (size_t)cap * sizeof *u);
        int64_t *s = u ? realloc(sizes, (size_t)cap * sizeof *s) : NULL;
        if (u) urls = u;
        if (s) sizes = s;
        if (!u || !s) { xmlFreeDoc(doc); tt_set_error("out of host memory"); goto done; }
      }
      if (asprintf(&urls[n], "s3://%s/%s", bucket, k) < 0) {
        xmlFreeDoc(doc);
        tt_set_error("out of host memory");
        goto done;
      }
      sizes[n++] = strtoll(num, NULL, 10);
    }
    int more = child_text(root, "IsTruncated", flag, sizeof flag) && !strcmp(flag, "true");
    int has_token = child_text(root, "NextContinuationToken", token, sizeof token) != NULL;
    xmlFreeDoc(doc);
    if (!more) break;
    if (!has_token || !token[0]) {
      tt_set_error("%s: a truncated listing without a continuation token", pattern);
      goto done;
    }
  }
  rc = 0;
done:
  free(prefix);
  tt_buf_free(&path);
  tt_buf_free(&body);
  if (rc) {
    for (int i = 0; i < n; i++) free(urls[i]);
    free(urls);
    free(sizes);
    return rc;
  }
  *urls_out = urls;
  *sizes_out = sizes;
  *n_out = n;
  return 0;
}

/* -- A FILE over an object, with read-ahead ------------------------------------------ */

typedef struct block {
  int64_t off;           /* -1: empty */
  size_t len;
  char *data;
} block;

typedef struct remote {
  char *url;
  int64_t size, pos;
  block cur, next;       /* next: being fetched, or fetched, by the read-ahead thread */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int64_t want;          /* block offset the thread should fetch next; -1 none */
  int busy, quit, next_rc, has_thread;
} remote;

static int fetch(remote *r, block *b, int64_t off) {
  size_t len = (size_t)(r->size - off < S.block ? r->size - off : S.block);
  b->off = -1;
  TT_TRY(tt_s3_read(r->url, off, b->data, len));
  b->off = off;
  b->len = len;
  return 0;
}

static void *read_ahead(void *arg) {
  remote *r = arg;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    while (!r->quit && r->want < 0) pthread_cond_wait(&r->cond, &r->lock);
    if (r->quit) break;
    int64_t off = r->want;
    r->want = -1;
    r->busy = 1;
    pthread_mutex_unlock(&r->lock);
    int rc = fetch(r, &r->next, off);
    pthread_mutex_lock(&r->lock);
    r->next_rc = rc;
    r->busy = 0;
    pthread_cond_broadcast(&r->cond);
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* Makes r->cur the block holding byte `pos`, from the read-ahead when it has it. */
static int load_block(remote *r, int64_t pos) {
  int64_t off = pos - pos % S.block;
  pthread_mutex_lock(&r->lock);
  while (r->busy || r->want >= 0) {
    if (!r->busy && r->want >= 0 && r->want != off) r->want = -1;   /* not needed now */
    else pthread_cond_wait(&r->cond, &r->lock);
  }
  int rc = 0;
  if (r->next.off == off && r->next_rc == 0) {
    block t = r->cur;
    r->cur = r->next;
    r->next = t;
  } else {
    /* Not fetched ahead (a seek), or the read-ahead failed: fetch it here, which
    ** retries and reports. */
    pthread_mutex_unlock(&r->lock);
    rc = fetch(r, &r->cur, off);
    pthread_mutex_lock(&r->lock);
  }
  r->next.off = -1;
  r->next_rc = 0;
  int64_t ahead = off + S.block;
  if (rc == 0 && ahead < r->size) {
    r->want = ahead;
    pthread_cond_signal(&r->cond);
  }
  pthread_mutex_unlock(&r->lock);
  return rc;
}

static ssize_t remote_read(void *cookie, char *buf, size_t size) {
  remote *r = cookie;
  size_t total = 0;
  while (total < size && r->pos < r->size) {
    if (r->cur.off < 0 || r->pos < r->cur.off || r->pos >= r->cur.off + (int64_t)r->cur.len) {
      if (load_block(r, r->pos) != 0) {
        if (total > 0) break;   /* the error comes back on the next call */
        errno = EIO;
        return -1;
      }
    }
    size_t at = (size_t)(r->pos - r->cur.off), n = r->cur.len - at;
    if (n > size - total) n = size - total;
    memcpy(buf + total, r->cur.data + at, n);
    total += n;
    r->pos += (int64_t)n;
  }
  return (ssize_t)total;
}

static int remote_seek(void *cookie, off64_t *offset, int whence) {
  remote *r = cookie;
  int64_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? r->pos : r->size;
  int64_t to = base + (int64_t)*offset;
  if (to < 0) {
    errno = EINVAL;
    return -1;
  }
  r->pos = to;
  *offset = to;
  return 0;
}

static int remote_close(void *cookie) {
  remote *r = cookie;
  if (r->has_thread) {
    pthread_mutex_lock(&r->lock);
    r->quit = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
  }
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  free(r->cur.data);
  free(r->next.data);
  free(r->url);
  free(r);
  return 0;
}

FILE *tt_s3_fopen(const char *url, int64_t size) {
  if (settings(url)) return NULL;
  remote *r = calloc(1, sizeof *r);
  if (!r) {
    tt_set_error("out of host memory");
    return NULL;
  }
  r->url = strdup(url);
  r->size = size;
  r->cur.off = r->next.off = r->want = -1;
  r->cur.data = malloc((size_t)S.block);
  r->next.data = malloc((size_t)S.block);
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  if (!r->url || !r->cur.data || !r->next.data) {
    remote_close(r);
    tt_set_error("out of host memory");
    return NULL;
  }
  if (pthread_create(&r->thread, NULL, read_ahead, r) != 0) {
    remote_close(r);
    tt_set_error("%s: cannot start the read-ahead thread", url);
    return NULL;
  }
  r->has_thread = 1;
  cookie_io_functions_t io = {.read = remote_read, .seek = remote_seek, .close = remote_close};
  FILE *f = fopencookie(r, "r", io);
  if (!f) {
    remote_close(r);
    tt_set_error("%s: fopencookie failed", url);
  }
  return f;
}

/* -- Local copies (token shards are mapped, so they are read from a local file) ------- */

static int mkdirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int rc = mkdir(path, 0755);
    *p = '/';
    if (rc != 0 && errno != EEXIST) return -1;
  }
  return 0;
}

int tt_s3_local_copy(const char *url, int64_t size, char *path, size_t cap) {
  const char *dir = getenv("TETRA_S3_CACHE");
  const char *tmp = getenv("TMPDIR");
  int n = dir && *dir ? snprintf(path, cap, "%s/%s", dir, url + 5)
                      : snprintf(path, cap, "%s/tetra-s3-cache/%s", tmp && *tmp ? tmp : "/tmp", url + 5);
  if (n < 0 || (size_t)n >= cap) return tt_set_error("%s: cache path too long", url);
  if (strstr(path, "/../")) return tt_set_error("%s: '..' in an object key", url);
  struct stat st;
  if (stat(path, &st) == 0 && st.st_size == size) return 0;   /* keys are immutable names */
  if (mkdirs(path) != 0) return tt_set_error("%s: cannot create the cache folder: %s", path, strerror(errno));
  char part[4200];
  snprintf(part, sizeof part, "%s.part.%d", path, (int)getpid());
  FILE *f = fopen(part, "wb");
  if (!f) return tt_set_error("%s: %s", part, strerror(errno));
  size_t chunk = (size_t)S.block;
  char *buf = malloc(chunk);
  int rc = buf ? 0 : tt_set_error("out of host memory");
  for (int64_t off = 0; rc == 0 && off < size; off += (int64_t)chunk) {
    size_t len = (size_t)(size - off < (int64_t)chunk ? size - off : (int64_t)chunk);
    rc = tt_s3_read(url, off, buf, len);
    if (rc == 0 && fwrite(buf, 1, len, f) != len) rc = tt_set_error("%s: write failed", part);
  }
  free(buf);
  if (fclose(f) != 0 && rc == 0) rc = tt_set_error("%s: write failed", part);
  if (rc == 0 && rename(part, path) != 0) rc = tt_set_error("%s: %s", path, strerror(errno));
  if (rc) unlink(part);
  return rc;
}

#endif
