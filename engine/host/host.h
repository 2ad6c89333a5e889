/*
** host.h — what the files of the tetra program (engine/host/) share: the Lua functions of
** the tetra.host module each file provides (main.c registers them), and the Ctrl-C and
** terminal state that terminal.c keeps and line reading (lineedit.c) consults.
*/
#ifndef TT_HOST_H
#define TT_HOST_H
#include <lauxlib.h>
#include <lua.h>
#include <signal.h>
#include <stdio.h>

/* -- YAML -> Lua tables (yaml.c) ----------------------------------------------------- */
/* host.load_yaml(path) and host.parse_yaml(text): one document as a Lua table. */
int tt_host_load_yaml(lua_State *L);
int tt_host_parse_yaml(lua_State *L);

/* -- Ctrl-C and the terminal (terminal.c) -------------------------------------------- */
/* Set by the SIGINT handler (g_interrupted), counted until a safe point takes one
** (g_unanswered); g_in_readline while a line is being read, when Ctrl-C only restarts the
** prompt. */
extern volatile sig_atomic_t g_interrupted, g_unanswered, g_in_readline;
/* The state Ctrl-C may interrupt (host.interrupt_lua); set once by main. */
extern lua_State *g_main_L;
/* The terminal host.take_terminal opened (NULL: stdin and stdout). */
extern FILE *g_tty_in, *g_tty_out;
int tt_host_catch_interrupts(lua_State *L);
int tt_host_interrupted(lua_State *L);
int tt_host_interrupt_lua(lua_State *L);
int tt_host_catch_stop_signal(lua_State *L);
int tt_host_stop_requested(lua_State *L);
int tt_host_take_terminal(lua_State *L);
int tt_host_give_back_terminal(lua_State *L);
int tt_host_tty_write(lua_State *L);

/* -- Line reading (lineedit.c; libedit when present) --------------------------------- */
/* Where line editing reads and writes (the taken terminal). */
void tt_host_line_streams(FILE *in, FILE *out);
int tt_host_readline(lua_State *L);
int tt_host_add_history(lua_State *L);
int tt_host_history(lua_State *L);
int tt_host_set_completer(lua_State *L);

#endif
