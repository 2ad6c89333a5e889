/*
** yaml.c — YAML configs as Lua tables (libyaml's event parser), for host.load_yaml and
** host.parse_yaml.
*/
#include "host/host.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* -- YAML -> Lua tables ------------------------------------------------------------- */

/* Plain (unquoted) scalars become numbers, booleans or nil the way YAML 1.2's core
** schema reads them; quoted scalars always stay strings. */
static void push_scalar(lua_State *L, const yaml_event_t *ev) {
  const char *s = (const char *)ev->data.scalar.value;
  size_t len = ev->data.scalar.length;
  if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
    lua_pushlstring(L, s, len);
    return;
  }
  if (len == 0 || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
      !strcmp(s, "NULL")) {
    lua_pushnil(L);
    return;
  }
  if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
    lua_pushboolean(L, 1);
    return;
  }
  if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
    lua_pushboolean(L, 0);
    return;
  }
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  if (*p == '.') p++;
  if (*p >= '0' && *p <= '9' && !(s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s + len) {
      lua_pushnumber(L, v);
      return;
    }
  }
  lua_pushlstring(L, s, len);
}

typedef struct yaml_reader {
  yaml_parser_t parser;
  char err[512];
} yaml_reader;

static int yaml_fail(yaml_reader *r, const char *what, const yaml_event_t *ev) {
  if (ev)
    snprintf(r->err, sizeof r->err, "%s at line %zu", what, ev->start_mark.line + 1);
  else if (r->parser.problem)
    snprintf(r->err, sizeof r->err, "%s at line %zu", r->parser.problem,
             r->parser.problem_mark.line + 1);
  else
    snprintf(r->err, sizeof r->err, "%s", what);
  return -1;
}

/* Pushes the node that starts with `ev` (already parsed). Returns 0 or -1 (r->err). */
static int yaml_push_node(lua_State *L, yaml_reader *r, yaml_event_t *ev, int depth);

static int yaml_next(yaml_reader *r, yaml_event_t *ev) {
  if (!yaml_parser_parse(&r->parser, ev)) return yaml_fail(r, "invalid YAML", NULL);
  return 0;
}

static int yaml_push_mapping(lua_State *L, yaml_reader *r, int depth) {
  lua_newtable(L);
  for (;;) {
    yaml_event_t key;
    if (yaml_next(r, &key)) return -1;
    if (key.type == YAML_MAPPING_END_EVENT) {
      yaml_event_delete(&key);
      return 0;
    }
    if (key.type != YAML_SCALAR_EVENT) {
      int rc = yaml_fail(r, "mapping keys must be plain scalars", &key);
      yaml_event_delete(&key);
      return rc;
    }
    /* Keys stay strings, even "1" or "true", so config paths read as written. */
    lua_pushlstring(L, (const char *)key.data.scalar.value, key.data.scalar.length);
    /* A key given twice is refused: YAML 1.2 forbids it, and taking the last one would
     * drop the first without a word (a tuned lr pasted below the default, say). */
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    int seen = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (seen) {
      char what[160];
      snprintf(what, sizeof what, "key '%.100s' appears twice in one mapping",
               (const char *)key.data.scalar.value);
      int rc = yaml_fail(r, what, &key);
      yaml_event_delete(&key);
      return rc;
    }
    yaml_event_delete(&key);
    yaml_event_t val;
    if (yaml_next(r, &val)) return -1;
    int rc = yaml_push_node(L, r, &val, depth + 1);
    yaml_event_delete(&val);
    if (rc) return -1;
    lua_rawset(L, -3);
  }
}

static int yaml_push_sequence(lua_State *L, yaml_reader *r, int depth) {
  lua_newtable(L);
  int i = 0;
  for (;;) {
    yaml_event_t item;
    if (yaml_next(r, &item)) return -1;
    if (item.type == YAML_SEQUENCE_END_EVENT) {
      yaml_event_delete(&item);
      return 0;
    }
    int rc = yaml_push_node(L, r, &item, depth + 1);
    yaml_event_delete(&item);
    if (rc) return -1;
    lua_rawseti(L, -2, ++i);
  }
}

static int yaml_push_node(lua_State *L, yaml_reader *r, yaml_event_t *ev, int depth) {
  if (depth > 64) return yaml_fail(r, "YAML nested too deeply", ev);
  if (!lua_checkstack(L, 4)) return yaml_fail(r, "out of Lua stack", ev);
  switch (ev->type) {
  case YAML_SCALAR_EVENT: push_scalar(L, ev); return 0;
  case YAML_MAPPING_START_EVENT: return yaml_push_mapping(L, r, depth);
  case YAML_SEQUENCE_START_EVENT: return yaml_push_sequence(L, r, depth);
  case YAML_ALIAS_EVENT: return yaml_fail(r, "YAML aliases (*name) are not supported", ev);
  default: return yaml_fail(r, "unexpected YAML event", ev);
  }
}

/* After the first document's node: the document's end, then the stream's. A second
** document (a "---" further down) is refused rather than dropped without a word. */
static int yaml_expect_end(yaml_reader *r) {
  for (;;) {
    yaml_event_t ev;
    if (yaml_next(r, &ev)) return -1;
    yaml_event_type_t type = ev.type;
    int rc = 0;
    if (type == YAML_DOCUMENT_START_EVENT)
      rc = yaml_fail(r, "a second YAML document (one config is one document)", &ev);
    else if (type != YAML_DOCUMENT_END_EVENT && type != YAML_STREAM_END_EVENT)
      rc = yaml_fail(r, "unexpected YAML event", &ev);
    yaml_event_delete(&ev);
    if (rc || type == YAML_STREAM_END_EVENT) return rc;
  }
}

/* Parses one YAML document from the reader's input and pushes it (nil when empty). */
static int yaml_push_document(lua_State *L, yaml_reader *r) {
  yaml_event_t ev;
  int top = lua_gettop(L);
  for (;;) {
    if (yaml_next(r, &ev)) return -1;
    if (ev.type == YAML_STREAM_END_EVENT) {
      yaml_event_delete(&ev);
      lua_pushnil(L);
      return 0;
    }
    if (ev.type == YAML_STREAM_START_EVENT || ev.type == YAML_DOCUMENT_START_EVENT) {
      yaml_event_delete(&ev);
      continue;
    }
    if (ev.type == YAML_DOCUMENT_END_EVENT) {
      yaml_event_delete(&ev);
      lua_pushnil(L);
      return 0;
    }
    int rc = yaml_push_node(L, r, &ev, 0);
    yaml_event_delete(&ev);
    if (rc == 0) rc = yaml_expect_end(r);
    if (rc) lua_settop(L, top);
    return rc;
  }
}

/* host.load_yaml(path) / host.parse_yaml(text) -> value | nil, "message". */
static int l_yaml(lua_State *L, int from_file) {
  const char *arg = luaL_checkstring(L, 1);
  size_t text_len = 0;
  if (!from_file) lua_tolstring(L, 1, &text_len);
  FILE *fp = NULL;
  if (from_file) {
    fp = fopen(arg, "rb");
    if (!fp) {
      lua_pushnil(L);
      lua_pushfstring(L, "%s: %s", arg, strerror(errno));
      return 2;
    }
  }
  yaml_reader r;
  memset(&r, 0, sizeof r);
  if (!yaml_parser_initialize(&r.parser)) {
    if (fp) fclose(fp);
    return luaL_error(L, "out of memory initialising the YAML parser");
  }
  if (fp)
    yaml_parser_set_input_file(&r.parser, fp);
  else
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)arg, text_len);
  int rc = yaml_push_document(L, &r);
  yaml_parser_delete(&r.parser);
  if (fp) fclose(fp);
  if (rc) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", from_file ? arg : "(yaml)", r.err);
    return 2;
  }
  return 1;
}

int tt_host_load_yaml(lua_State *L) { return l_yaml(L, 1); }
int tt_host_parse_yaml(lua_State *L) { return l_yaml(L, 0); }
