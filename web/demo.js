// The demo page: two padded sentences (the seed documents' example) through one multi-head attention layer
// (the library's sentence_example, as the native `demo` runs it), drawn as per-head
// heatmaps by the library's own renderer, checked against the CPU reference.
import { fail, openContext, report } from './page.js';

const $ = (id) => document.getElementById(id);

function draw({ width, height, rgba }, caption) {
  const figure = document.createElement('figure');
  const canvas = document.createElement('canvas');
  [canvas.width, canvas.height] = [width, height];
  canvas.getContext('2d').putImageData(new ImageData(rgba, width, height), 0, 0);
  const text = document.createElement('figcaption');
  text.textContent = caption;
  figure.append(canvas, text);
  $('figures').append(figure);
}

async function main() {
  const { ctx, adapter } = await openContext();
  const r = await ctx.sentenceExample();
  r.images.forEach((image, b) => draw(image, `sentence ${b + 1}: ${r.sentences[b].join(' ')}`));
  const verdict = r.passed ? 'agrees with the CPU reference' : 'DOES NOT agree with the CPU reference';
  $('summary').className = r.passed ? 'ok' : 'failed';
  $('summary').textContent = `On ${adapter.name || 'this browser\'s adapter'} (${adapter.device_type}, ${adapter.backend}) the layer ${verdict}: output within ` +
    `${r.outError.toExponential(1)} (bound ${r.bounds.output.toExponential(0)}), weights within ` +
    `${r.weightsError.toExponential(1)} (bound ${r.bounds.weights.toExponential(0)}); ` +
    `largest weight on a pad key: ${r.padWeight}.`;
  const { images, weights, ...summary } = r;
  await report({ adapter, ...summary, image_sizes: images.map((i) => [i.width, i.height]) });
}

main().catch(fail);
