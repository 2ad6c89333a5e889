/*
** preinit_env.h — environment variables for the shared libraries' constructors, set from
** an executable's .preinit_array. libgomp reads OMP_WAIT_POLICY and OpenBLAS reads
** OPENBLAS_CORETYPE in their constructors, before main; .preinit_array functions run
** before those, but also before libc's own initialisation, which points `environ` back at
** the array the kernel passed (envp) afterwards: a setenv there builds a new array that
** is dropped a moment later, unseen by any library (glibc 2.36: getenv even answers NULL).
** What survives is the envp array itself, which has no free slot. So a variable is set by
** lending it, for the constructors' moment, the slot of one no library reads at load time
** (`_`, OLDPWD, SHLVL, PWD, TERM ...), and main gives the slots back first thing.
*/
#ifndef TT_PREINIT_ENV_H
#define TT_PREINIT_ENV_H

/* NAME's value in envp, or NULL (getenv does not work yet in .preinit_array). */
const char *tt_preinit_getenv(char **envp, const char *name);

/* In a .preinit_array function: NAME=VALUE for the constructors of the shared libraries,
** unless NAME is set already. Returns 1 when set, 0 when NAME was set or no slot could be
** lent (an environment of none of the lendable names, e.g. `env -i`), -1 when VALUE is
** too long (63 bytes with the name at most) or three variables are lent already. */
int tt_preinit_setenv(char **envp, const char *name, const char *value);

/* First thing in main: the lent slots hold their own variables again and the variables
** set above are gone, so the environment is the user's (children decide afresh). */
void tt_preinit_restore(void);

#endif
