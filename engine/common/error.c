/*
** error.c — the thread-local error message behind tt_last_error().
*/
#include "common/common.h"

enum { TT_ERROR_LEN = 1024 };
static _Thread_local char tt_error_buf[TT_ERROR_LEN];

const char *tt_last_error(void) { return tt_error_buf; }

void tt_clear_error(void) { tt_error_buf[0] = '\0'; }

int tt_fail(const char *msg) { return tt_set_error("%s", msg); }

int tt_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tt_error_buf, TT_ERROR_LEN, fmt, ap);
  va_end(ap);
  return -1;
}

int tt_error_context(const char *fmt, ...) {
  char prefix[512], old[TT_ERROR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, tt_error_buf, TT_ERROR_LEN);
  /* Truncation is fine: the message keeps its start and stays terminated. */
  size_t n = strlen(prefix);
  if (n > TT_ERROR_LEN - 3) n = TT_ERROR_LEN - 3;
  memcpy(tt_error_buf, prefix, n);
  memcpy(tt_error_buf + n, ": ", 2);
  size_t rest = TT_ERROR_LEN - n - 3, m = strlen(old);
  if (m > rest) m = rest;
  memcpy(tt_error_buf + n + 2, old, m);
  tt_error_buf[n + 2 + m] = '\0';
  return -1;
}
