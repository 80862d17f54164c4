import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { Widget } from '@lumino/widgets';

import { ISaveRound } from './noticeModel';

/** A save that has not finished in this long counts as failed (a "file changed on disk" dialog nobody answers). */
const SAVE_TIMEOUT_MS = 15_000;

/** The open documents with unsaved changes, each once (two views of one file share a context). */
export function dirtyContexts(
  widgets: Iterable<Widget>
): DocumentRegistry.Context[] {
  const contexts = new Set<DocumentRegistry.Context>();
  for (const widget of widgets) {
    if (
      widget instanceof DocumentWidget &&
      !widget.isDisposed &&
      !widget.context.isDisposed &&
      widget.context.model.dirty
    ) {
      contexts.add(widget.context);
    }
  }
  return [...contexts];
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = window.setTimeout(
      () => reject(new Error(`not saved in ${ms / 1000} s`)),
      ms
    );
    promise.then(
      value => {
        window.clearTimeout(timer);
        resolve(value);
      },
      reason => {
        window.clearTimeout(timer);
        reject(reason);
      }
    );
  });
}

/**
 * Saves every open document that has unsaved changes, all at once, through
 * each document's own context (as File > Save does); one that fails is
 * counted and the others are still saved.
 */
export async function saveOpenDocuments(
  widgets: Iterable<Widget>
): Promise<ISaveRound> {
  const contexts = dirtyContexts(widgets);
  const results = await Promise.allSettled(
    contexts.map(c => withTimeout(c.save(), SAVE_TIMEOUT_MS))
  );
  const round: ISaveRound = { saved: [], failed: [] };
  results.forEach((result, i) => {
    const path = contexts[i].localPath || contexts[i].path;
    if (result.status === 'fulfilled') {
      round.saved.push(path);
    } else {
      console.warn(`workbench-gpu-monitor: could not save ${path}`, result);
      round.failed.push(path);
    }
  });
  return round;
}
