/* main.c - emliod placeholder until the server module lands this session.
 * SPDX-License-Identifier: MIT
 */
int
main(void)
{
    return 1;
}
