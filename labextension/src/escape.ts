/**
 * Text from outside the page (a server's answer, an engine set's id, a hub's message) as HTML, safe in element text
 * and in quoted attributes alike: every character that HTML gives a meaning there is written as an entity.
 */
const ENTITIES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

export function escape(text: string): string {
  return String(text).replace(/[&<>"']/g, c => ENTITIES[c]);
}
