/*
** preinit_env.c — variables for the libraries' constructors through lent envp slots (see
** preinit_env.h). No allocation: this runs before libc is initialised.
*/
#include "preinit_env.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* Variables no shared library of the program reads in its constructor, in the order they
** are lent: set by shells and launchers, read by programs after main if at all. */
static const char *const lendable[] = {"_",    "OLDPWD",  "SHLVL", "LS_COLORS", "PWD",
                                       "TERM", "SHELL",   "LOGNAME", "USER",    "HOME",
                                       "HOSTNAME", "MAIL"};

enum { MAX_LENT = 3 };
static struct {
  char text[64];        /* NAME=VALUE, what the constructors saw */
  char *owner;          /* the slot's own NAME=VALUE */
} g_lent[MAX_LENT];
static int g_n_lent;

static const char *value_of(const char *entry, const char *name) {
  size_t n = strlen(name);
  return !strncmp(entry, name, n) && entry[n] == '=' ? entry + n + 1 : NULL;
}

const char *tt_preinit_getenv(char **envp, const char *name) {
  for (char **e = envp; e && *e; e++) {
    const char *v = value_of(*e, name);
    if (v) return v;
  }
  return NULL;
}

static int is_lent(const char *entry) {
  for (int i = 0; i < g_n_lent; i++)
    if (entry == g_lent[i].text) return 1;
  return 0;
}

int tt_preinit_setenv(char **envp, const char *name, const char *value) {
  if (tt_preinit_getenv(envp, name)) return 0;
  if (g_n_lent == MAX_LENT) return -1;
  int len = snprintf(g_lent[g_n_lent].text, sizeof g_lent[0].text, "%s=%s", name, value);
  if (len < 0 || (size_t)len >= sizeof g_lent[0].text) return -1;
  for (size_t k = 0; k < sizeof lendable / sizeof lendable[0]; k++)
    for (char **e = envp; e && *e; e++)
      if (!is_lent(*e) && value_of(*e, lendable[k])) {
        g_lent[g_n_lent].owner = *e;
        *e = g_lent[g_n_lent++].text;
        return 1;
      }
  return 0;
}

void tt_preinit_restore(void) {
  for (int i = 0; i < g_n_lent; i++) {
    char **e = environ;
    while (e && *e && *e != g_lent[i].text) e++;
    if (e && *e) *e = g_lent[i].owner;
    else putenv(g_lent[i].owner);   /* a constructor's setenv copied the array */
  }
  g_n_lent = 0;
}
