/*
** lineedit.c — reading a line for the REPL: libedit with history and tab completion when
** the build found it, a plain read otherwise; Ctrl-C at the prompt starts a new line.
*/
#include "host/host.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TETRA_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

/* -- Line reading (libedit when present) -------------------------------------------- */

void tt_host_line_streams(FILE *in, FILE *out) {
#ifdef TETRA_HAVE_LIBEDIT
  rl_instream = in;
  rl_outstream = out;
#else
  (void)in;
  (void)out;
#endif
}

#ifdef TETRA_HAVE_LIBEDIT
/* Tab completion: libedit hands over the word before the cursor; the Lua function set by
** host.set_completer(fn) gets (word, line up to the cursor) and returns an array of
** candidates, each a whole replacement for the word. */
static int g_completer_ref = LUA_NOREF;
static lua_State *g_completer_L = NULL;
static char **g_matches = NULL;
static int g_n_matches = 0, g_next_match = 0;

static void free_matches(void) {
  for (int i = 0; i < g_n_matches; i++) free(g_matches[i]);
  free(g_matches);
  g_matches = NULL;
  g_n_matches = g_next_match = 0;
}

static char *match_generator(const char *text, int state) {
  (void)text;
  if (state == 0) g_next_match = 0;
  if (g_next_match >= g_n_matches) return NULL;
  return strdup(g_matches[g_next_match++]);
}

static char **complete(const char *text, int start, int end) {
  (void)end;
  lua_State *L = g_completer_L;
  rl_attempted_completion_over = 1;   /* no file-name completion when Lua finds none */
  free_matches();
  if (!L || g_completer_ref == LUA_NOREF) return NULL;
  int top = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, g_completer_ref);
  lua_pushstring(L, text);
  lua_pushlstring(L, rl_line_buffer, (size_t)start + strlen(text));
  if (lua_pcall(L, 2, 1, 0) != 0 || !lua_istable(L, -1)) {
    lua_settop(L, top);
    return NULL;
  }
  int n = (int)lua_objlen(L, -1);
  g_matches = n > 0 ? calloc((size_t)n, sizeof(char *)) : NULL;
  for (int i = 0; g_matches && i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    const char *m = lua_tostring(L, -1);
    if (m && (g_matches[g_n_matches] = strdup(m)) != NULL) g_n_matches++;
    lua_pop(L, 1);
  }
  lua_settop(L, top);
  if (g_n_matches == 0) return NULL;
  return rl_completion_matches(text, match_generator);
}
#endif

/* host.set_completer(fn): fn(word, line) -> { candidates } drives Tab. */
int tt_host_set_completer(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
#ifdef TETRA_HAVE_LIBEDIT
  if (g_completer_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, g_completer_ref);
  lua_pushvalue(L, 1);
  g_completer_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  /* Dots and colons stay inside the word, so "model.tok<Tab>" completes a field. */
  static char breaks[] = " \t\n\"'`<>=;|&{}()[],+-*/%^~#";
  rl_completer_word_break_characters = breaks;
  rl_basic_word_break_characters = breaks;
  rl_attempted_completion_function = complete;
#endif
  return 0;
}

/* host.readline(prompt) -> line without the newline; nil at end of input; or false when
** Ctrl-C interrupted the line being typed (the REPL starts a fresh one). The prompt is
** only shown on a terminal so piped sessions stay clean. */
int tt_host_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "");
  int tty = isatty(STDIN_FILENO) || g_tty_in;
  g_interrupted = g_unanswered = 0;
#ifdef TETRA_HAVE_LIBEDIT
  if (tty) {
    g_completer_L = L;
    g_in_readline = 1;
    char *line = readline(prompt);
    g_in_readline = 0;
    g_completer_L = NULL;
    if (g_interrupted) {
      g_interrupted = 0;
      free(line);
      fputs("^C\n", rl_outstream ? rl_outstream : stdout);
      fflush(rl_outstream ? rl_outstream : stdout);
      lua_pushboolean(L, 0);
      return 1;
    }
    if (!line) return 0;
    lua_pushstring(L, line);
    free(line);
    return 1;
  }
#endif
  FILE *in = g_tty_in ? g_tty_in : stdin;
  if (tty) {
    FILE *out = g_tty_out ? g_tty_out : stdout;
    fputs(prompt, out);
    fflush(out);
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  int c, any = 0;
  while ((c = getc(in)) != EOF && c != '\n') {
    luaL_addchar(&b, (char)c);
    any = 1;
  }
  if (c == EOF && g_interrupted && ferror(in)) {
    clearerr(in);
    g_interrupted = 0;
    lua_pushboolean(L, 0);
    return 1;
  }
  if (c == EOF && !any) return 0;
  luaL_pushresult(&b);
  return 1;
}

int tt_host_add_history(lua_State *L) {
  const char *line = luaL_checkstring(L, 1);
#ifdef TETRA_HAVE_LIBEDIT
  add_history(line);
#else
  (void)line;
#endif
  return 0;
}

/* host.history(path, "load"|"save"): silently does nothing without libedit. */
int tt_host_history(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  const char *op = luaL_checkstring(L, 2);
#ifdef TETRA_HAVE_LIBEDIT
  stifle_history(2000);
  int rc = !strcmp(op, "save") ? write_history(path) : read_history(path);
  lua_pushboolean(L, rc == 0);
#else
  (void)path;
  (void)op;
  lua_pushboolean(L, 0);
#endif
  return 1;
}
